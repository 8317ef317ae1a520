package ratelimit

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashgate/flashgate/config"
)

// Limits are the gateway's limits, retuned as a whole by Apply.
type Limits struct {
	IP *Keyed
	// Net is the per-IPv6-/48 tier above IP.
	Net  *Keyed
	User *Keyed
	Sale *Keyed
	// OrderView limits a buyer's GETs of orders (per_user_view; always local).
	OrderView *Keyed
	inflight  atomic.Int64
	maxIn     atomic.Int64
	global    atomic.Bool
	// Denied remembers the keys the fleet-wide limits refused (global mode).
	Denied *DenyCache

	mu      sync.Mutex
	current config.RateLimit
	loaded  time.Time
	source  string
	lastErr string
	errAt   time.Time
	// shadowed are the keys the environment sets (key → variable).
	shadowed map[string]string
}

// New builds the limits of cfg; keyed limiters hold at most maxKeys keys each.
func New(cfg config.RateLimit, maxKeys int, source string) *Limits {
	l := &Limits{
		IP:        NewKeyed(cfg.PerIP, maxKeys),
		Net:       NewKeyed(cfg.PerNet, maxKeys),
		User:      NewKeyed(cfg.PerUser, maxKeys),
		Sale:      NewKeyed(cfg.PerSale, maxKeys),
		OrderView: NewKeyed(cfg.PerUserView, maxKeys),
		// The refusals of the fleet-wide limits: one key per user or sale
		// over its limit, for at most a wait each.
		Denied: NewDenyCache(maxKeys),
	}
	l.apply(cfg, source)
	return l
}

// Apply puts validated limits in force at once; invalid ones are refused and
// recorded, and the limits in force stay.
func (l *Limits) Apply(cfg config.RateLimit, source string) error {
	if err := cfg.Validate(); err != nil {
		l.Refused(err)
		return err
	}
	l.apply(cfg, source)
	return nil
}

func (l *Limits) apply(cfg config.RateLimit, source string) {
	l.IP.SetRate(cfg.PerIP)
	l.Net.SetRate(cfg.PerNet)
	l.User.SetRate(cfg.PerUser)
	l.Sale.SetRate(cfg.PerSale)
	l.OrderView.SetRate(cfg.PerUserView)
	l.maxIn.Store(int64(cfg.MaxInflight))
	l.global.Store(cfg.Global())
	l.mu.Lock()
	l.current, l.loaded, l.source, l.lastErr = cfg, time.Now(), source, ""
	l.mu.Unlock()
}

// Global reports whether the per-user and per-sale budgets are fleet-wide,
// in Redis (ratelimit.mode: global); per-IP is local in both modes.
func (l *Limits) Global() bool { return l.global.Load() }

// Refused records a reload that could not be applied (invalid, unreadable).
func (l *Limits) Refused(err error) {
	l.mu.Lock()
	l.lastErr, l.errAt = err.Error(), time.Now()
	l.mu.Unlock()
}

// Shadow records the keys of the block that an environment variable sets
// (key → variable): a reload of the file does not change them.
func (l *Limits) Shadow(keys map[string]string) {
	l.mu.Lock()
	l.shadowed = keys
	l.mu.Unlock()
}

// Enter admits one request past pre-validation unless max_inflight are in
// flight already; every true must be paired with Leave.
func (l *Limits) Enter() bool {
	n := l.inflight.Add(1)
	if m := l.maxIn.Load(); m > 0 && n > m {
		l.inflight.Add(-1)
		return false
	}
	return true
}

// Leave ends a request Enter admitted.
func (l *Limits) Leave() { l.inflight.Add(-1) }

// Inflight is the number of requests in flight past pre-validation.
func (l *Limits) Inflight() int64 { return l.inflight.Load() }

// View is what GET /admin/v1/limits shows.
type View struct {
	Limits      config.RateLimit `json:"limits"`
	LoadedAt    time.Time        `json:"loaded_at"`
	Source      string           `json:"source"`
	LastError   string           `json:"last_reload_error,omitempty"`
	LastErrorAt *time.Time       `json:"last_reload_error_at,omitempty"`
	// ShadowedByEnv are the keys a FLASHGATE_* variable sets: the file's
	// value of each is not used (key → variable).
	ShadowedByEnv map[string]string `json:"shadowed_by_env,omitempty"`
	Inflight      int64             `json:"inflight"`
	Keys          map[string]int    `json:"keys"`
}

// View reports the limits in force.
func (l *Limits) View() View {
	l.mu.Lock()
	v := View{Limits: l.current, LoadedAt: l.loaded, Source: l.source, LastError: l.lastErr, ShadowedByEnv: l.shadowed}
	if l.lastErr != "" {
		at := l.errAt
		v.LastErrorAt = &at
	}
	l.mu.Unlock()
	v.Inflight = l.Inflight()
	v.Keys = map[string]int{"ip": l.IP.Len(), "net": l.Net.Len(), "user": l.User.Len(), "sale": l.Sale.Len(), "view": l.OrderView.Len()}
	return v
}

// Sweep drops idle keys of every keyed limiter.
func (l *Limits) Sweep(now time.Time) {
	n := now.UnixNano()
	l.IP.Sweep(n)
	l.Net.Sweep(n)
	l.User.Sweep(n)
	l.Sale.Sweep(n)
	l.OrderView.Sweep(n)
	l.Denied.Sweep(n)
}
