package gateway

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics"
	"github.com/flashgate/flashgate/ratelimit"
)

// sale is the gateway's local view of one sale: the spec (for pre-validation
// without I/O), its Redis keys built once, and an approximate stock figure.
type sale struct {
	spec     *flashgate.Sale
	loc      *time.Location // spec.TimeZone, where limit windows begin
	keys     *lua.Keys
	startsMS int64
	endsMS   int64
	closed   atomic.Bool
	// paused: purchases answer 503 paused (the sale's meta says so; events
	// and the periodic reload keep it current).
	paused atomic.Bool
	// remaining is refreshed from Redis in the background; GET shows it.
	remaining atomic.Int64
	byRegion  atomic.Pointer[map[string]int64]
	info      atomic.Pointer[[]byte] // the public JSON, rebuilt on refresh
	warmAsked atomic.Int64           // unix ms of our last warm request
	// hintChecked (unix ms) and hintQueued: the last read of the stock on
	// a sold-out hint, and whether one waits (hints.go).
	hintChecked atomic.Int64
	hintQueued  atomic.Bool

	// soldOut marks the sale ("" key) or each region sold out: a purchase
	// then answers 409 from memory. Set by an admission that found no stock,
	// by another gateway's event, or by the refresh that reads 0; cleared by a
	// restocked event or a refresh that reads stock.
	soldOut map[string]*atomic.Bool
	slot    uint16 // Redis Cluster hash slot of the sale's keys
	// bucketSlots are the slots of a split sale's buckets (docs/buckets.md).
	bucketSlots []uint16
	rateKey     uint64 // the sale's key in the per-sale rate limiter
	// subject is the sale's JetStream order subject, built by its first
	// publish (the subject's prefix is the gateway's configuration).
	subject atomic.Pointer[string]
	// lane is the sale's degraded lane on this gateway (degrade.go).
	lane laneState

	// counts are the purchase answers by code, sent to the backends every
	// second for the live view (stats.go).
	counts metrics.SaleCounters

	// limitBodies are the sale's 403 limit_reached bodies, written once:
	// [0] for per_user_limit, [1+i] for spec.Limits[i] (limitBody).
	limitBodies [][]byte
}

func newSale(spec *flashgate.Sale) *sale {
	s := &sale{
		spec:     spec,
		keys:     lua.KeysOf(spec),
		startsMS: spec.StartsAt.UnixMilli(),
		endsMS:   spec.EndsAt.UnixMilli(),
	}
	loc, err := spec.Location()
	if err != nil {
		// Validated at creation, so only a host without that zone's data gets
		// here; the binary embeds time/tzdata.
		slog.Error("sale time zone unknown here; windows in UTC", "sale", spec.ID, "tz", spec.TimeZone, "err", err)
		loc = time.UTC
	}
	s.loc = loc
	s.closed.Store(spec.Closed)
	s.paused.Store(spec.Paused)
	s.remaining.Store(spec.Total)
	s.soldOut = map[string]*atomic.Bool{}
	if len(spec.Regions) == 0 {
		s.soldOut[""] = new(atomic.Bool)
	}
	for r := range spec.Regions {
		s.soldOut[r] = new(atomic.Bool)
	}
	s.slot = hashSlot("s:" + spec.ID)
	for _, b := range s.keys.Buckets() {
		s.bucketSlots = append(s.bucketSlots, uint16(lua.Slot(b.Meta)))
	}
	s.rateKey = ratelimit.KeyString(spec.ID)
	s.limitBodies = append(s.limitBodies, limitBody(flashgate.DimUser,
		"user limit reached: at most "+strconv.FormatInt(spec.PerUserLimit, 10)+" units per user"))
	for _, l := range spec.Limits {
		s.limitBodies = append(s.limitBodies, limitBody(l.Dimension, string(l.Dimension)+" limit reached: "+l.String()))
	}
	s.render(time.Now())
	return s
}

// limitBody is the 403 body of the limit the admission named: i indexes
// spec.Limits, anything else (-1) is per_user_limit.
func (s *sale) limitBody(i int) []byte {
	if i >= 0 && i+1 < len(s.limitBodies) {
		return s.limitBodies[1+i]
	}
	return s.limitBodies[0]
}

// slotOf is the slot user's admissions run on: the sale's, or the home
// bucket's of a split sale.
func (s *sale) slotOf(user string) uint16 {
	if len(s.bucketSlots) == 0 {
		return s.slot
	}
	return s.bucketSlots[lua.HomeBucket(user, len(s.bucketSlots))]
}

// soldOutFlag is the mark of region ("" for a sale without regions); nil for
// a region the sale does not have.
func (s *sale) soldOutFlag(region string) *atomic.Bool { return s.soldOut[region] }

// allSoldOut reports whether the whole sale is marked sold out: its one mark,
// or every region's.
func (s *sale) allSoldOut() bool {
	for _, f := range s.soldOut {
		if !f.Load() {
			return false
		}
	}
	return len(s.soldOut) > 0
}

// marks counts the sold-out marks held.
func (s *sale) marks() int {
	n := 0
	for _, f := range s.soldOut {
		if f.Load() {
			n++
		}
	}
	return n
}

// publicSale is the body of GET /v1/sales/{sale} (docs/design.md §3).
type publicSale struct {
	ID           string            `json:"id"`
	Title        string            `json:"title"`
	PriceCents   int64             `json:"price_cents"`
	StartsAt     time.Time         `json:"starts_at"`
	EndsAt       time.Time         `json:"ends_at"`
	PerUserLimit int64             `json:"per_user_limit"`
	PerOrderMax  int64             `json:"per_order_max"`
	Regions      map[string]int64  `json:"regions,omitempty"`
	Limits       []flashgate.Limit `json:"limits,omitempty"`
	TimeZone     string            `json:"time_zone,omitempty"`
	Buckets      int               `json:"buckets"`
	State        string            `json:"state"`
	Remaining    int64             `json:"remaining"`
	RemainingBy  map[string]int64  `json:"remaining_by_region,omitempty"`
}

func (s *sale) render(now time.Time) {
	spec := *s.spec
	spec.Closed = s.closed.Load()
	spec.Paused = s.paused.Load()
	rem := s.remaining.Load()
	var by map[string]int64
	if p := s.byRegion.Load(); p != nil {
		by = *p
	}
	b, _ := json.Marshal(publicSale{
		ID: spec.ID, Title: spec.Title, PriceCents: spec.PriceCents,
		StartsAt: spec.StartsAt, EndsAt: spec.EndsAt,
		PerUserLimit: spec.PerUserLimit, PerOrderMax: spec.PerOrderMax,
		Regions: spec.Regions, Limits: spec.Limits, TimeZone: spec.TimeZone, Buckets: spec.BucketCount(),
		State:     string(spec.StateAt(now, rem)),
		Remaining: rem, RemainingBy: by,
	})
	s.info.Store(&b)
}

// sales is a copy-on-write map: lookups on the hot path take no lock.
type sales struct {
	m  atomic.Pointer[map[string]*sale]
	mu sync.Mutex // serialises writers
	// grace is how long past its ends_at a sale is still loaded and kept
	// (sales.live_grace, docs/retention.md).
	grace time.Duration
}

func newSales(grace time.Duration) *sales {
	s := &sales{grace: grace}
	m := map[string]*sale{}
	s.m.Store(&m)
	return s
}

// get looks a sale up by the bytes of the path; string(id) in a map index
// does not allocate.
func (s *sales) get(id []byte) *sale { return (*s.m.Load())[string(id)] }

func (s *sales) list() []*sale {
	m := *s.m.Load()
	out := make([]*sale, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// put adds or updates a sale. An unchanged spec keeps its entry (and its live
// state); a changed one replaces it.
func (s *sales) put(spec *flashgate.Sale) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.m.Load()
	if cur, ok := old[spec.ID]; ok {
		a, b := *cur.spec, *spec
		a.Closed, b.Closed = false, false
		a.Paused, b.Paused = false, false
		if reflect.DeepEqual(a, b) {
			if spec.Closed {
				cur.closed.Store(true)
			}
			cur.paused.Store(spec.Paused)
			return
		}
	}
	m := maps.Clone(old)
	m[spec.ID] = newSale(spec)
	s.m.Store(&m)
}

// load reads the live sales Redis holds: those ending after now − grace (the
// live index and each one's meta hash), however many ended sales Redis still
// holds. Then it forgets the sales that ended before now − grace.
func (s *sales) load(ctx context.Context, rc rueidis.Client) error {
	return s.loadAt(ctx, rc, time.Now())
}

func (s *sales) loadAt(ctx context.Context, rc rueidis.Client, now time.Time) error {
	ids, err := lua.LiveSales(ctx, rc, now.Add(-s.grace))
	if err != nil {
		return err
	}
	defer s.prune(now)
	for _, id := range ids {
		spec, err := lua.LoadSale(ctx, rc, id)
		if err != nil {
			// Not warmed (Redis lost it): a purchase answers 503 and asks for a warm.
			slog.Debug("sale in index but not loadable", "sale", id, "err", err)
			continue
		}
		s.put(spec)
	}
	return nil
}

// prune forgets the sales that ended before now − grace: their purchases and
// order requests answer 404 sale_not_found from then on, on every gateway
// alike (one started later never loads them). The rule is the sale's own
// ends_at, not its absence from Redis's index: after Redis lost its data a sale
// must stay known, its purchases answering 503 while it is warmed again.
func (s *sales) prune(now time.Time) {
	cut := now.Add(-s.grace).UnixMilli()
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.m.Load()
	var m map[string]*sale
	for id, sl := range old {
		if sl.endsMS > cut {
			continue
		}
		if m == nil {
			m = maps.Clone(old)
		}
		delete(m, id)
	}
	if m != nil {
		s.m.Store(&m)
	}
}

// retire forgets a sale retention removed from Redis (the backend's retired
// event) before its ends_at + grace: one closed early. A sale still selling
// is kept whatever the event says: only a sale that is over is ever retired.
func (s *sales) retire(id string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.m.Load()
	sl, ok := old[id]
	if !ok || (!sl.closed.Load() && now.UnixMilli() < sl.endsMS) {
		return
	}
	m := maps.Clone(old)
	delete(m, id)
	s.m.Store(&m)
}

// refreshStock reads the approximate remaining units of every open sale.
func (s *sales) refreshStock(ctx context.Context, rc rueidis.Client, now time.Time) {
	for _, sl := range s.list() {
		if !sl.closed.Load() && now.UnixMilli() < sl.endsMS {
			if rem, err := lua.Remaining(ctx, rc, sl.keys); err == nil {
				var total int64
				for r, n := range rem {
					total += n
					// Redis is the truth: this heals a lost or reordered event.
					if f := sl.soldOutFlag(r); f != nil {
						f.Store(n <= 0)
					}
				}
				sl.remaining.Store(total)
				if len(sl.spec.Regions) > 0 {
					sl.byRegion.Store(&rem)
				}
			}
		}
		sl.render(now)
	}
}

// regionName returns the sale's own copy of a region name, without
// allocating, or "" for a region the sale does not have.
func (s *sale) regionName(b []byte) string {
	for r := range s.spec.Regions {
		if r == string(b) {
			return r
		}
	}
	return ""
}

// setPaused marks a cached sale paused or not (an event, or admit.lua's
// answer); a sale not cached is left to the next load.
func (s *sales) setPaused(id string, paused bool) {
	if c := s.get([]byte(id)); c != nil {
		c.paused.Store(paused)
	}
}
