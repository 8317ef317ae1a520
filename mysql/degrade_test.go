package mysql

import (
	"context"
	"database/sql"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/internal/testenv"
)

// laneSale creates a sale with degrade: mysql, a phone limit (1 order per
// phone) and two regions, and answers a lane for it: buy sends one purchase
// through DecideDegraded with Redis away.
func laneSale(t *testing.T, starts time.Time) (*sql.DB, *flashgate.Sale, func(o flashgate.Order, inFlight ...flashgate.Order) LaneResult) {
	t.Helper()
	db := openTest(t)
	if err := Migrate(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	s := &flashgate.Sale{ID: "lane", Title: "t", PriceCents: 100, Total: 5, StartsAt: starts, EndsAt: starts.Add(time.Hour),
		PerUserLimit: 3, PerOrderMax: 2, Regions: map[string]int64{"a": 3, "b": 2},
		Limits:  []flashgate.Limit{{Dimension: flashgate.DimPhone, Max: 1, Of: flashgate.OfOrders}},
		Degrade: flashgate.DegradeMySQL, DegradeRate: 4}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := InsertSale(ctx(t), db, s, time.Now()); err != nil {
		t.Fatal(err)
	}
	var next atomic.Uint64
	next.Store(1000)
	buy := func(o flashgate.Order, inFlight ...flashgate.Order) LaneResult {
		t.Helper()
		o.SaleID = s.ID
		if o.CreatedAt.IsZero() {
			o.CreatedAt = time.Now().UTC().Truncate(time.Millisecond)
		}
		o.ExpiresAt = o.CreatedAt.Add(15 * time.Minute)
		r, err := DecideDegraded(ctx(t), db, LanePurchase{Order: o, InFlight: inFlight, NextID: func() uint64 { return next.Add(1) }}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	return db, s, buy
}

func saleRow(t *testing.T, db *sql.DB, id string) *SaleRow {
	t.Helper()
	row, err := LoadSale(ctx(t), db, id)
	if err != nil {
		t.Fatal(err)
	}
	return row
}

// Each of admit.lua's answers, from MySQL: admitted (written confirmed, the
// counters moved, the sale stale), replay, per-user and per-phone limits,
// region and sale stock, quantity, a region the sale lacks, a missing subject;
// every refusal leaves MySQL as it was.
func TestLaneChecks(t *testing.T) {
	t.Parallel()
	db, s, buy := laneSale(t, time.Now().Add(-time.Minute).UTC().Truncate(time.Millisecond))
	if row := saleRow(t, db, s.ID); row.Degrade != flashgate.DegradeMySQL || row.DegradeRate != 4 || row.Stale != 0 {
		t.Fatalf("sale as stored: degrade %q rate %d stale %d", row.Degrade, row.DegradeRate, row.Stale)
	}
	ok := buy(flashgate.Order{UserID: "u1", Quantity: 2, Region: "a", Phone: "+111111", IdemKey: "k1"})
	if ok.Outcome != flashgate.LaneAdmitted || ok.OrderID == 0 || ok.Remaining != 1 {
		t.Fatalf("first purchase: %+v", ok)
	}
	o, err := Order(ctx(t), db, s.ID, ok.OrderID)
	if err != nil || o.Status != flashgate.OrderConfirmed || o.Quantity != 2 || o.Charges != "0/sale/1/+111111" {
		t.Fatalf("order row %+v, %v", o, err)
	}
	if row := saleRow(t, db, s.ID); row.Sold != 2 || row.RegionSold["a"] != 2 || row.Stale != 1 {
		t.Fatalf("after one order: sold %d, a %d, stale %d", row.Sold, row.RegionSold["a"], row.Stale)
	}

	cases := []struct {
		name string
		o    flashgate.Order
		want flashgate.LaneOutcome
		lim  int
	}{
		{"replay of k1", flashgate.Order{UserID: "u1", Quantity: 1, Region: "b", Phone: "+999999", IdemKey: "k1"}, flashgate.LaneReplayed, 0},
		{"per-user limit", flashgate.Order{UserID: "u1", Quantity: 2, Region: "b", Phone: "+222222"}, flashgate.LaneLimitReached, -1},
		{"phone limit", flashgate.Order{UserID: "u2", Quantity: 1, Region: "b", Phone: "+111111"}, flashgate.LaneLimitReached, 0},
		{"region a sold out", flashgate.Order{UserID: "u3", Quantity: 2, Region: "a", Phone: "+333333"}, flashgate.LaneSoldOut, 0},
		{"quantity over per_order_max", flashgate.Order{UserID: "u3", Quantity: 3, Region: "b", Phone: "+333333"}, flashgate.LaneBadQuantity, 0},
		{"quantity 0", flashgate.Order{UserID: "u3", Quantity: 0, Region: "b", Phone: "+333333"}, flashgate.LaneBadQuantity, 0},
		{"unknown region", flashgate.Order{UserID: "u3", Quantity: 1, Region: "zz", Phone: "+333333"}, flashgate.LaneBadOrder, 0},
		{"no region", flashgate.Order{UserID: "u3", Quantity: 1, Phone: "+333333"}, flashgate.LaneBadOrder, 0},
		{"no phone", flashgate.Order{UserID: "u3", Quantity: 1, Region: "b"}, flashgate.LaneBadOrder, 0},
	}
	for _, c := range cases {
		r := buy(c.o)
		if r.Outcome != c.want || (c.want == flashgate.LaneLimitReached && r.Limit != c.lim) {
			t.Errorf("%s: %+v, want %s", c.name, r, c.want)
		}
		if c.want == flashgate.LaneReplayed && (r.OrderID != ok.OrderID || r.Status != flashgate.OrderConfirmed) {
			t.Errorf("%s answers order %d (%s), want %d", c.name, r.OrderID, r.Status, ok.OrderID)
		}
		if c.want == flashgate.LaneLimitReached && c.lim == -1 && r.Held != 2 {
			t.Errorf("%s: held %d, want 2", c.name, r.Held)
		}
	}
	// An order id already taken: duplicate_id, and nothing written.
	at := time.Now().UTC()
	dup, err := DecideDegraded(ctx(t), db, LanePurchase{Order: flashgate.Order{SaleID: s.ID, UserID: "u6", Quantity: 1, Region: "b",
		Phone: "+666666", CreatedAt: at, ExpiresAt: at.Add(time.Minute)}, NextID: func() uint64 { return ok.OrderID }}, at)
	if err != nil || dup.Outcome != flashgate.LaneDuplicateID {
		t.Errorf("a taken order id: %+v, %v", dup, err)
	}
	if row := saleRow(t, db, s.ID); row.Sold != 2 || row.Stale != 1 || row.RegionSold["b"] != 0 {
		t.Fatalf("refusals moved MySQL: sold %d, stale %d, b %d", row.Sold, row.Stale, row.RegionSold["b"])
	}
	if n := mustLedger(t, db, s.ID); n.Sold != 2 {
		t.Fatalf("ledger after the refusals: %+v", n)
	}
	if n, err := SaleOrderCount(ctx(t), db, s.ID); err != nil || n != 1 {
		t.Fatalf("orders %d, %v; want 1", n, err)
	}

	// The rest of the stock: region b's 2 units, then nothing.
	if r := buy(flashgate.Order{UserID: "u4", Quantity: 2, Region: "b", Phone: "+444444"}); r.Outcome != flashgate.LaneAdmitted || r.Remaining != 0 {
		t.Fatalf("last units: %+v", r)
	}
	if r := buy(flashgate.Order{UserID: "u5", Quantity: 1, Region: "b", Phone: "+555555"}); r.Outcome != flashgate.LaneSoldOut {
		t.Fatalf("after the last units: %+v", r)
	}
	l := mustLedger(t, db, s.ID)
	if l.Sold != 4 || saleRow(t, db, s.ID).Stale != 2 {
		t.Fatalf("ledger %+v", l)
	}
}

// The window: not started (with the wait), ended, closed, each judged by
// MySQL's clock inside the lane's transaction (invariant 8): the caller's
// clock (the order's CreatedAt, the gateway's now) decides nothing.
func TestLaneWindow(t *testing.T) {
	t.Parallel()
	starts := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
	db, s, buy := laneSale(t, starts)
	now := time.Now().UTC().Truncate(time.Millisecond)
	r := buy(flashgate.Order{UserID: "u1", Quantity: 1, Region: "a", Phone: "+111111", CreatedAt: now})
	if r.Outcome != flashgate.LaneNotStarted || r.Wait <= 59*time.Minute || r.Wait > time.Hour {
		t.Fatalf("before the start: %+v (want a wait of about an hour by MySQL's clock)", r)
	}
	// A caller whose clock says the sale started (or ended) long ago.
	for _, at := range []time.Time{starts.Add(time.Minute), starts.Add(2 * time.Hour)} {
		if r := buy(flashgate.Order{UserID: "u1", Quantity: 1, Region: "a", Phone: "+111111", CreatedAt: at}); r.Outcome != flashgate.LaneNotStarted {
			t.Fatalf("the caller's clock at %v: %+v, want not started (MySQL's clock decides)", at, r)
		}
	}
	if err := CloseSale(ctx(t), db, s.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	if r := buy(flashgate.Order{UserID: "u1", Quantity: 1, Region: "a", Phone: "+111111", CreatedAt: starts.Add(time.Minute)}); r.Outcome != flashgate.LaneEnded {
		t.Fatalf("closed: %+v", r)
	}
	// A sale whose window passed, bought by a caller whose clock is inside it.
	past := time.Now().Add(-2 * time.Hour).UTC().Truncate(time.Millisecond)
	_, _, buyPast := laneSale(t, past)
	if r := buyPast(flashgate.Order{UserID: "u1", Quantity: 1, Region: "a", Phone: "+111111", CreatedAt: past.Add(time.Minute)}); r.Outcome != flashgate.LaneEnded {
		t.Fatalf("after the end: %+v", r)
	}
}

// Orders the fast path admitted that are still in the stream (not in MySQL)
// hold their units, per user and per limit, as Redis held them; once MySQL
// has an order's row it counts there and not twice. Redis back and the sale
// fresh: the lane leaves the purchase to the fast path.
// Finding 9 of the rebuild issue: a retry on the lane of an idempotency key
// whose order is still in the stream replays that order; it is not a second.
func TestLaneKeyInFlight(t *testing.T) {
	t.Parallel()
	_, s, buy := laneSale(t, time.Now().Add(-time.Minute).UTC().Truncate(time.Millisecond))
	fly := flashgate.Order{ID: 7, SaleID: s.ID, UserID: "u1", Quantity: 1, Region: "a", IdemKey: "k-1", Charges: "0/sale/1/+111111"}
	if r := buy(flashgate.Order{UserID: "u1", Quantity: 1, Region: "a", Phone: "+111111", IdemKey: "k-1"}, fly); r.Outcome != flashgate.LaneReplayed || r.OrderID != 7 {
		t.Fatalf("retry of a key in flight: %+v, want a replay of order 7", r)
	}
	if r := buy(flashgate.Order{UserID: "u2", Quantity: 1, Region: "a", Phone: "+222222", IdemKey: "k-1"}, fly); r.Outcome != flashgate.LaneAdmitted {
		t.Fatalf("another buyer's key of the same name: %+v, want admitted", r)
	}
}

func TestLaneInFlightAndFresh(t *testing.T) {
	t.Parallel()
	db, s, buy := laneSale(t, time.Now().Add(-time.Minute).UTC().Truncate(time.Millisecond))
	fly := []flashgate.Order{
		{ID: 1, SaleID: s.ID, UserID: "u1", Quantity: 2, Region: "a", Charges: "0/sale/1/+111111"},
		{ID: 2, SaleID: s.ID, UserID: "u2", Quantity: 2, Region: "b", Charges: "0/sale/1/+222222"},
	}
	if r := buy(flashgate.Order{UserID: "u1", Quantity: 2, Region: "a", Phone: "+777777"}, fly...); r.Outcome != flashgate.LaneLimitReached || r.Limit != -1 || r.Held != 2 {
		t.Fatalf("user with 2 units in flight: %+v", r)
	}
	if r := buy(flashgate.Order{UserID: "u9", Quantity: 1, Region: "b", Phone: "+222222"}, fly...); r.Outcome != flashgate.LaneLimitReached || r.Limit != 0 {
		t.Fatalf("phone with an order in flight: %+v", r)
	}
	if r := buy(flashgate.Order{UserID: "u9", Quantity: 2, Region: "a", Phone: "+999999"}, fly...); r.Outcome != flashgate.LaneSoldOut || r.Remaining != 1 {
		t.Fatalf("region a with 2 of 3 in flight: %+v", r)
	}
	if r := buy(flashgate.Order{UserID: "u9", Quantity: 1, Region: "a", Phone: "+999999"}, fly...); r.Outcome != flashgate.LaneAdmitted || r.Remaining != 0 {
		t.Fatalf("the unit left in a: %+v", r)
	}
	// Order 1 lands in MySQL (the writer): it counts once, as sold.
	tx, err := Begin(ctx(t), db)
	if err != nil {
		t.Fatal(err)
	}
	o := fly[0]
	o.Status, o.CreatedAt, o.ExpiresAt = flashgate.OrderConfirmed, time.Now(), time.Now().Add(time.Minute)
	must := mustFor(t)
	must(GuardSold(ctx(t), tx, s.ID, 2, time.Now(), true))
	must(GuardRegion(ctx(t), tx, s.ID, "a", 2))
	if err := InsertOrders(ctx(t), tx, []flashgate.Order{o}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if r := buy(flashgate.Order{UserID: "u8", Quantity: 1, Region: "a", Phone: "+888888"}, fly...); r.Outcome != flashgate.LaneSoldOut || r.Remaining != 0 {
		t.Fatalf("region a, order 1 written: %+v", r)
	}
	// Redis back: the stale sale stays on the lane; a fresh one goes back.
	r, err := DecideDegraded(ctx(t), db, LanePurchase{Order: flashgate.Order{SaleID: s.ID, UserID: "u7", Quantity: 1, Region: "b",
		Phone: "+121212", CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Minute)}, InFlight: fly, RedisUp: true, NextID: func() uint64 { return 77 }}, time.Now())
	if err != nil || r.Outcome != flashgate.LaneSoldOut {
		t.Fatalf("stale sale with Redis up: %+v, %v (region b: 2 in flight)", r, err)
	}
	tx, err = Begin(ctx(t), db)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := LockStale(ctx(t), tx, s.ID); err != nil || n != 1 {
		t.Fatalf("stale %d, %v", n, err)
	}
	if err := ClearStale(ctx(t), tx, s.ID); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r, err = DecideDegraded(ctx(t), db, LanePurchase{Order: flashgate.Order{SaleID: s.ID, UserID: "u7", Quantity: 1, Region: "b",
		Phone: "+121212", CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Minute)}, RedisUp: true, NextID: func() uint64 { return 78 }}, time.Now())
	if err != nil || r.Outcome != flashgate.LaneFresh {
		t.Fatalf("fresh sale with Redis up: %+v, %v", r, err)
	}
	if st, err := StaleSales(ctx(t), db); err != nil || len(st) != 0 {
		t.Fatalf("stale sales %v, %v", st, err)
	}
}

// A lane node is one backend's at a time, and free again when its session ends.
func TestLaneNode(t *testing.T) {
	t.Parallel()
	db := openTest(t)
	a, err := LeaseLaneNode(ctx(t), db, 2000, 2)
	if err != nil || a.Node != 2000 || !a.Held(ctx(t)) {
		t.Fatalf("first: %+v, %v", a, err)
	}
	b, err := LeaseLaneNode(ctx(t), db, 2000, 2)
	if err != nil || b.Node != 2001 {
		t.Fatalf("second: %+v, %v", b, err)
	}
	if _, err := LeaseLaneNode(ctx(t), db, 2000, 2); err == nil {
		t.Fatal("a third lease of two nodes")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	c, err := LeaseLaneNode(ctx(t), db, 2000, 2)
	if err != nil || c.Node != 2000 {
		t.Fatalf("after a closed: %+v, %v", c, err)
	}
	b.Close()
	c.Close()
}

// BenchmarkLane is the lane's purchases of one sale, every buyer new, from as
// many goroutines as -cpu says: each a transaction on the sale row lock, so
// the figure is MySQL's (docs/degrade.md, BENCHMARKS.md).
func BenchmarkLane(b *testing.B) {
	db, err := OpenDB(testenv.MySQL(b))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	c := context.Background()
	if err := Migrate(c, db); err != nil {
		b.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	s := &flashgate.Sale{ID: "bench", Title: "t", Total: 1 << 30, StartsAt: now.Add(-time.Minute), EndsAt: now.Add(time.Hour),
		PerUserLimit: 1, PerOrderMax: 1, Degrade: flashgate.DegradeMySQL}
	if err := InsertSale(c, db, s, now); err != nil {
		b.Fatal(err)
	}
	var ids atomic.Uint64
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := ids.Add(1)
			at := time.Now()
			r, err := DecideDegraded(c, db, LanePurchase{Order: flashgate.Order{SaleID: s.ID, UserID: "u" + strconv.FormatUint(id, 10),
				Quantity: 1, CreatedAt: at, ExpiresAt: at.Add(time.Minute)}, NextID: func() uint64 { return id }}, at)
			if err != nil || r.Outcome != flashgate.LaneAdmitted {
				b.Fatalf("%+v, %v", r, err)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "purchases/s")
}
