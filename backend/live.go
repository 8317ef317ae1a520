package backend

// The live numbers of every recent sale: the leader's per-sale gauges
// (metrics.Sales, the conservation error among them) and the live view at
// /ui/ (docs/observability.md).
//
// What the backend reads itself, every second: the ledger from MySQL and Redis
// (reconciler.readLedger, the same read reconcile judges invariant 3 by) and
// the sale's messages still in the orders stream. What only the gateways see
// (requests, refusals by code, admissions) they send over NATS every second
// (bus.GatewayStats): the backends need no list of gateways to scrape, a
// gateway behind nginx needs no admin port reachable from the backends, and the
// same subscription serves every backend, leader or not.
//
// Beside the numbers of now, the view serves each sale's last five minutes a
// second at a time (liveseries.go): the traffic as the stats arrive, the books
// as they are read.

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/tick"
	"github.com/flashgate/flashgate/metrics"
	"github.com/flashgate/flashgate/mysql"
)

const (
	// gaugeEvery is how often the leader sets the per-sale gauges.
	gaugeEvery = time.Second
	// gatewayForget: a gateway silent this long is left out of the rates.
	gatewayForget = 5 * time.Second
	// Whoever holds a gateway's NATS credential can send stats under any
	// gateway name (bus.SubscribeStats takes at most bus.MaxStatsBytes a
	// message): at most maxGateways gateways are kept, each message with at
	// most maxStatsSales sales of the known set (warmer.isKnown), each with
	// at most maxStatsCodes codes and maxLatencyBuckets latency buckets, and
	// limits of at most maxLimitsBytes; a gateway silent gatewayForget is
	// dropped on the next message.
	maxGateways       = 64
	maxStatsSales     = 256
	maxStatsCodes     = 128
	maxLatencyBuckets = 64
	maxLimitsBytes    = 8 << 10
)

// live holds the gateways' latest stats and reads a sale's books.
type live struct {
	rec    *reconciler
	gauges *metrics.Sales
	log    *slog.Logger

	// known reports whether a sale id is one MySQL has (nil: any).
	known func(string) bool

	mu   sync.Mutex
	gws  map[string]*gatewaySamples
	hist map[string]*saleHistory // each sale's series (liveseries.go)
}

// gatewaySamples are one gateway's last two stats messages.
type gatewaySamples struct {
	prev, cur bus.GatewayStats
	heard     time.Time
}

func newLive(rec *reconciler, gauges *metrics.Sales, log *slog.Logger) *live {
	return &live{rec: rec, gauges: gauges, log: log, gws: map[string]*gatewaySamples{}, hist: map[string]*saleHistory{}}
}

// onStats keeps a gateway's stats (bus.SubscribeStats) and writes what it
// answered since its previous report into the series.
func (l *live) onStats(st bus.GatewayStats) {
	now := time.Now()
	if st.At.After(now.Add(gatewayForget)) {
		return // from a clock far ahead: it would hold the name's place
	}
	l.bound(&st)
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.gws[st.Gateway]
	if g == nil {
		l.pruneGateways(now)
		if len(l.gws) >= maxGateways {
			return
		}
		g = &gatewaySamples{}
		l.gws[st.Gateway] = g
	}
	if !st.At.After(g.cur.At) {
		return // out of order
	}
	g.prev, g.cur, g.heard = g.cur, st, now
	l.pruneHistory(now)
	l.recordTraffic(&g.prev, &g.cur, now)
}

// bound trims a stats message to what the live view keeps: sales of the
// known set, maxStatsSales of them, maxStatsCodes codes and
// maxLatencyBuckets buckets each, and limits of at most maxLimitsBytes.
func (l *live) bound(st *bus.GatewayStats) {
	for sale, codes := range st.Sales {
		switch {
		case l.known != nil && !l.known(sale):
			delete(st.Sales, sale)
		case len(codes) > maxStatsCodes:
			for code := range codes {
				if len(codes) <= maxStatsCodes {
					break
				}
				delete(codes, code)
			}
		}
	}
	for len(st.Sales) > maxStatsSales {
		for sale := range st.Sales {
			delete(st.Sales, sale)
			break
		}
	}
	for sale, b := range st.AcceptedLatency {
		if _, ok := st.Sales[sale]; !ok || len(b) > maxLatencyBuckets {
			delete(st.AcceptedLatency, sale)
		}
	}
	if len(st.Limits) > maxLimitsBytes {
		st.Limits = nil
	}
}

// pruneGateways forgets the gateways silent gatewayForget. l.mu is held.
func (l *live) pruneGateways(now time.Time) {
	for id, g := range l.gws {
		if now.Sub(g.heard) > gatewayForget {
			delete(l.gws, id)
		}
	}
}

// gatewayCount is how many gateways' stats are kept (tests).
func (l *live) gatewayCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.gws)
}

// Funnel is one sale's traffic over the gateways heard from lately: answers
// per second between each gateway's last two reports, and the totals since
// those gateways started.
type Funnel struct {
	Gateways         int                `json:"gateways"`
	RequestsPerSec   float64            `json:"requests_per_sec"`
	AdmissionsPerSec float64            `json:"admissions_per_sec"`
	RefusalsPerSec   map[string]float64 `json:"refusals_per_sec"`
	Requests         uint64             `json:"requests"`
	Admissions       uint64             `json:"admissions"`
	ByCode           map[string]uint64  `json:"by_code"`
}

// funnels sums the live gateways' stats per sale, and answers their rate limits.
func (l *live) funnels(now time.Time) (map[string]*Funnel, map[string]json.RawMessage) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]*Funnel{}
	limits := map[string]json.RawMessage{}
	get := func(sale string) *Funnel {
		f := out[sale]
		if f == nil {
			f = &Funnel{RefusalsPerSec: map[string]float64{}, ByCode: map[string]uint64{}}
			out[sale] = f
		}
		return f
	}
	for id, g := range l.gws {
		if now.Sub(g.heard) > gatewayForget {
			delete(l.gws, id)
			continue
		}
		limits[id] = g.cur.Limits
		dt := g.cur.At.Sub(g.prev.At).Seconds()
		for sale, codes := range g.cur.Sales {
			f := get(sale)
			f.Gateways++
			for code, n := range codes {
				f.ByCode[code] += n
				f.Requests += n
				if code == string(flashgate.CodeAccepted) {
					f.Admissions += n
				}
				if g.prev.At.IsZero() || dt <= 0 {
					continue
				}
				before := g.prev.Sales[sale][code]
				if before > n {
					before = 0 // the gateway's counter began again (the sale was reloaded)
				}
				rate := float64(n-before) / dt
				f.RequestsPerSec += rate
				if code == string(flashgate.CodeAccepted) {
					f.AdmissionsPerSec += rate
				} else if code != string(metrics.CodeOK) {
					f.RefusalsPerSec[code] += rate
				}
			}
		}
	}
	return out, limits
}

// read is sale id's books now (metrics.SaleState) and its row. A sale that
// retention removed from Redis is settled: nothing reserved, nothing pending,
// the rest unsold.
func (l *live) read(ctx context.Context, id string) (metrics.SaleState, *saleRow, error) {
	led, err := l.rec.readLedger(ctx, id)
	if err != nil {
		return metrics.SaleState{}, nil, err
	}
	retired, err := saleRetired(ctx, l.rec.db, id)
	if err != nil {
		return metrics.SaleState{}, nil, err
	}
	row := led.row
	if retired != nil {
		return metrics.SaleState{Total: row.Total, Sold: row.Sold, Remaining: row.Total - row.Sold}, row, nil
	}
	st := led.state()
	pending, err := l.rec.stream.streamCount(ctx, id)
	if err != nil {
		return metrics.SaleState{}, nil, err
	}
	return metrics.SaleState{
		Total: st.Total, Remaining: st.Remaining, Reserved: st.Reserved, Sold: st.Sold,
		Pending: int64(pending), Conservation: st.Diff,
	}, row, nil
}

// recentSales are the sales the leader watches: those that end after an hour
// ago (reconcile's set).
func (l *live) recentSales(ctx context.Context) ([]string, error) {
	return mysql.RecentSaleIDs(ctx, l.rec.db, time.Now().UTC().Add(-reconcileRecent))
}

// gaugeLoop sets every recent sale's gauges every gaugeEvery while ctx (the
// leader lock's) lasts, and drops them all when it ends: only the leader
// exports them.
func (l *live) gaugeLoop(ctx context.Context) {
	defer l.gauges.Reset()
	shown := map[string]bool{}
	tick.Every(ctx, gaugeEvery, func(time.Time) {
		ids, err := l.recentSales(ctx)
		if err != nil {
			if ctx.Err() == nil {
				l.log.Warn("sale gauges: listing sales", "err", err)
			}
			return
		}
		for _, id := range ids {
			st, _, err := l.read(ctx, id)
			switch {
			case ctx.Err() != nil:
				return
			case errors.Is(err, errSaleNotFound):
				continue
			case err != nil:
				l.log.Warn("sale gauges", "sale", id, "err", err)
				continue
			}
			l.gauges.Set(id, st)
			l.recordBooks(id, time.Now(), st)
			shown[id] = true
		}
		for id := range shown {
			if !slices.Contains(ids, id) {
				l.gauges.Forget(id)
				delete(shown, id)
			}
		}
	})
}

// LiveSale is one sale in the live view: its spec (the limits in force), its
// state now, its books, its funnel and its last minutes (nil: nothing yet).
type LiveSale struct {
	Sale   *flashgate.Sale     `json:"sale"`
	State  flashgate.SaleState `json:"state"`
	Books  liveBooks           `json:"books"`
	Funnel *Funnel             `json:"funnel"`
	Series *Series             `json:"series"`
}

type liveBooks struct {
	Total        int64 `json:"total"`
	Remaining    int64 `json:"remaining"`
	Reserved     int64 `json:"reserved"`
	Sold         int64 `json:"sold"`
	Pending      int64 `json:"pending"`
	Conservation int64 `json:"conservation_error_units"`
}

// LiveView is GET /ui/live.json: every recent sale, and each live gateway's
// rate limits in force.
type LiveView struct {
	At            time.Time                  `json:"at"`
	Sales         []LiveSale                 `json:"sales"`
	GatewayLimits map[string]json.RawMessage `json:"gateway_limits"`
}

// view reads every recent sale now.
func (l *live) view(ctx context.Context) (LiveView, error) {
	now := time.Now()
	v := LiveView{At: now.UTC(), Sales: []LiveSale{}}
	ids, err := l.recentSales(ctx)
	if err != nil {
		return v, err
	}
	funnels, limits := l.funnels(now)
	v.GatewayLimits = limits
	for _, id := range ids {
		st, row, err := l.read(ctx, id)
		if errors.Is(err, errSaleNotFound) {
			continue
		}
		if err != nil {
			return v, err
		}
		f := funnels[id]
		if f == nil {
			f = &Funnel{RefusalsPerSec: map[string]float64{}, ByCode: map[string]uint64{}}
		}
		// Into the series too: a backend not the leader has books there only
		// from the views it serves.
		l.recordBooks(id, time.Now(), st)
		v.Sales = append(v.Sales, LiveSale{
			Sale: &row.Sale, State: row.Sale.StateAt(now, st.Remaining), Funnel: f,
			Books: liveBooks{Total: st.Total, Remaining: st.Remaining, Reserved: st.Reserved, Sold: st.Sold,
				Pending: st.Pending, Conservation: st.Conservation},
		})
	}
	now = time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	complete := l.completeThrough(now)
	for i := range v.Sales {
		v.Sales[i].Series = l.series(v.Sales[i].Sale.ID, now, complete)
	}
	return v, nil
}
