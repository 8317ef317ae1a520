package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// warmRetention makes a sale ending at ends known to Redis (meta, stock, both
// indexes) and removes it when the test ends.
func warmRetention(t testing.TB, rc rueidis.Client, ends time.Time) *flashgate.Sale {
	t.Helper()
	s := &flashgate.Sale{ID: testenv.ID("ret"), Title: "t", PriceCents: 100, Total: 10,
		StartsAt: ends.Add(-time.Hour), EndsAt: ends.Truncate(time.Millisecond).UTC(), PerUserLimit: 2, PerOrderMax: 2}
	if _, err := lua.Load().Warm(context.Background(), rc, s, map[string]int64{"": s.Total}); err != nil {
		t.Fatalf("warm: %v", err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = lua.Retire(c, rc, s)
	})
	return s
}

// The refresh reads the sales that end after now − live_grace and no others,
// and forgets those that ended before; a sale Redis lost (not in the index)
// but not yet over stays known (its purchases answer 503 and ask for a warm).
func TestRefreshReadsOnlyLiveSales(t *testing.T) {
	rc := testenv.Redis(t, testenv.RedisAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now := time.Now()
	const grace = time.Hour
	live := warmRetention(t, rc, now.Add(time.Hour))
	recent := warmRetention(t, rc, now.Add(-grace/2))   // ended, within the grace: 410
	old := warmRetention(t, rc, now.Add(-48*time.Hour)) // ended long ago, not retired yet

	ids, err := lua.LiveSales(ctx, rc, now.Add(-grace))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, id := range ids {
		got[id] = true
	}
	if !got[live.ID] || !got[recent.ID] || got[old.ID] {
		t.Fatalf("live index read: live %v recent %v old %v, want true true false", got[live.ID], got[recent.ID], got[old.ID])
	}

	ss := newSales(grace)
	// A gateway that knew the old sale (it started before the sale ended) and
	// an open sale whose keys Redis lost.
	ss.put(old)
	lost := &flashgate.Sale{ID: testenv.ID("lost"), Title: "t", PriceCents: 1, Total: 1,
		StartsAt: now.Add(-time.Hour), EndsAt: now.Add(time.Hour), PerUserLimit: 1, PerOrderMax: 1}
	ss.put(lost)
	if err := ss.loadAt(ctx, rc, now); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		s    *flashgate.Sale
		want bool
	}{{live, true}, {recent, true}, {old, false}, {lost, true}} {
		if have := ss.get([]byte(c.s.ID)) != nil; have != c.want {
			t.Errorf("sale ending %s ago: held %v, want %v", now.Sub(c.s.EndsAt).Round(time.Minute), have, c.want)
		}
	}
	// Time passes: the recent sale leaves the grace and is forgotten.
	if err := ss.loadAt(ctx, rc, now.Add(grace)); err != nil {
		t.Fatal(err)
	}
	if ss.get([]byte(recent.ID)) != nil {
		t.Error("a sale ended more than live_grace ago is still held")
	}
	if ss.get([]byte(live.ID)) == nil {
		t.Error("a live sale was forgotten")
	}
}

// A purchase of a sale that ended within live_grace answers 410 ended; once
// the gateway forgot it (and however long Redis keeps it), 404 sale_not_found,
// reserving nothing.
func TestPurchaseOfForgottenSale(t *testing.T) {
	e := start(t)
	recent := warmRetention(t, e.rc, time.Now().Add(-time.Minute))
	old := warmRetention(t, e.rc, time.Now().Add(-e.cfg.Sales.LiveGrace-time.Hour))
	e.g.sales.put(recent)
	e.g.sales.put(old) // as if this gateway had known it before it ended
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.g.sales.load(ctx, e.rc); err != nil {
		t.Fatal(err)
	}
	tok := e.token("buyer")
	if r := e.buy(recent, tok, `{"quantity":1}`, nil); r.Status != 410 || r.Code != string(flashgate.CodeEnded) {
		t.Errorf("recently ended sale: %d %s, want 410 %s", r.Status, r.Code, flashgate.CodeEnded)
	}
	if r := e.buy(old, tok, `{"quantity":1}`, nil); r.Status != 404 || r.Code != string(flashgate.CodeSaleNotFound) {
		t.Errorf("sale ended past live_grace: %d %s, want 404 %s", r.Status, r.Code, flashgate.CodeSaleNotFound)
	}
	if rem, resv := e.stock(old); rem != old.Total || resv != 0 {
		t.Errorf("forgotten sale: remaining %d reservations %d, want %d 0", rem, resv, old.Total)
	}
}

// The backend's retired event makes gateways forget a sale closed early (its
// ends_at still ahead); one still selling is kept whatever the event says.
func TestRetiredEventForgetsClosedSale(t *testing.T) {
	e := start(t)
	closed := e.sale(func(s *flashgate.Sale) { s.Closed = true })
	open := e.sale(nil)
	nc := testenv.NATS(t)
	for _, s := range []*flashgate.Sale{open, closed} {
		if err := bus.PublishEvent(nc, e.cfg.NATS, bus.SaleEvent{Type: bus.EventRetired, SaleID: s.ID}); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.g.sales.get([]byte(closed.ID)) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the closed sale is still held after its retired event")
		}
		time.Sleep(20 * time.Millisecond)
	}
	tok := e.token("buyer")
	if r := e.buy(closed, tok, `{"quantity":1}`, nil); r.Status != 404 || r.Code != string(flashgate.CodeSaleNotFound) {
		t.Errorf("retired closed sale: %d %s, want 404", r.Status, r.Code)
	}
	// Events from one connection arrive in order: the open sale's, sent
	// before the closed one's, has been handled.
	if e.g.sales.get([]byte(open.ID)) == nil {
		t.Fatal("a sale still selling was forgotten on a retired event")
	}
	if r := e.buy(open, tok, `{"quantity":1}`, nil); r.Status != 202 {
		t.Errorf("open sale: %d %s, want 202", r.Status, r.Code)
	}
}
