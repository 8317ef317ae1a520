package backend

import (
	"context"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
	"github.com/flashgate/flashgate/orderid"
)

// The lane and the fast path share one buyer's limit: an order Redis admitted
// that is still in the stream counts against the lane's per-user check; the
// lane's orders are in MySQL only, and the rewarm brings them into Redis
// (buyers, records, keys, stock) beside the still pending one, so the fast
// path resumes with nothing counted twice or missed, and once the stream
// drains the ledger holds.
func TestLaneThenRewarm(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	e := newEnv(t, []string{srv.Addr})
	b := idleBackend(t, e)
	sale := spec(10, 2, nil)
	sale.PerOrderMax, sale.Degrade = 2, flashgate.DegradeMySQL
	k := e.createSale(sale)

	// The fast path: u1's order is in the stream (Redis then goes away), u2's
	// is written.
	o1 := admit(t, e.rc, k, "u1", 1, "")
	publishTo(t, b.js, e, o1)
	o2 := admit(t, e.rc, k, "u2", 1, "")
	if out := e.process(sale.ID, []flashgate.Order{o2}); out[0].Status != flashgate.OrderConfirmed {
		t.Fatalf("o2: %+v", out[0])
	}

	// The lane, with Redis away.
	l := newLane(b)
	fly, err := l.inFlight(ctx(t), sale.ID)
	if err != nil || len(fly) != 1 || fly[0].ID != o1.ID {
		t.Fatalf("in flight: %v, %v", fly, err)
	}
	node, err := mysql.LeaseLaneNode(ctx(t), e.db, orderid.LeasedNodes, orderid.LaneNodes)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	gen := orderid.New(node.Node)
	buy := func(user string, qty int64, idem string) mysql.LaneResult {
		t.Helper()
		now := time.Now().UTC().Truncate(time.Millisecond)
		r, err := mysql.DecideDegraded(ctx(t), e.db, mysql.LanePurchase{Order: flashgate.Order{SaleID: sale.ID, UserID: user,
			Quantity: qty, IdemKey: idem, CreatedAt: now, ExpiresAt: now.Add(time.Minute)}, InFlight: fly, NextID: gen.Next}, now)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := buy("u1", 2, ""); r.Outcome != flashgate.LaneLimitReached || r.Held != 1 {
		t.Fatalf("u1 with 1 unit in flight buys 2: %+v", r)
	}
	lane1 := buy("u1", 1, "k1")
	lane3 := buy("u3", 2, "")
	if lane1.Outcome != flashgate.LaneAdmitted || lane3.Outcome != flashgate.LaneAdmitted || orderid.NodeOf(lane1.OrderID) != node.Node {
		t.Fatalf("lane orders: %+v %+v (node %d)", lane1, lane3, node.Node)
	}
	if r := buy("u1", 1, "k1"); r.Outcome != flashgate.LaneReplayed || r.OrderID != lane1.OrderID {
		t.Fatalf("replay of k1: %+v", r)
	}
	if row, err := loadSale(ctx(t), e.db, sale.ID); err != nil || row.Stale != 2 || row.Sold != 4 {
		t.Fatalf("after the lane: %+v, %v", row, err)
	}
	// An order only the stream holds, with a key (finding 9 of the rebuild
	// issue: the old rewarm wrote no reservation, record or key for it).
	now5 := time.Now().UTC().Truncate(time.Millisecond)
	o5 := flashgate.Order{ID: nextID.Add(1), SaleID: sale.ID, UserID: "u5", Quantity: 1, IdemKey: "k5",
		CreatedAt: now5, ExpiresAt: now5.Add(15 * time.Minute)}
	publishTo(t, b.js, e, o5)

	// Redis answers again: the leader's rewarm.
	did, err := b.rewarm(ctx(t), sale.ID)
	if err != nil || !did {
		t.Fatalf("rewarm: %v, %v", did, err)
	}
	if row, err := loadSale(ctx(t), e.db, sale.ID); err != nil || row.Stale != 0 {
		t.Fatalf("after the rewarm: stale %d, %v", row.Stale, err)
	}
	// sold 4 (u2's 1, the lane's 3), pending 2 (o1, o5): 4 left.
	if got := remaining(t, e.rc, k, ""); got != 4 {
		t.Errorf("stock after the rewarm: %d, want 4", got)
	}
	if known, err := lua.IdemKnown(ctx(t), e.rc, k, "u5", "k5"); err != nil || !known {
		t.Errorf("k5 (an order only in the stream) in Redis: %v, %v", known, err)
	}
	if st, _ := redisStatus(t, e.rc, k, o5.ID); st != string(lua.StatusProcessing) {
		t.Errorf("o5's record after the rewarm: %q, want processing", st)
	}
	for user, want := range map[string]int64{"u1": 2, "u2": 1, "u3": 2, "u5": 1} {
		if got := userUnits(t, e, k, user); got != want {
			t.Errorf("Redis: %s holds %d, want %d", user, got, want)
		}
	}
	if st, _ := redisStatus(t, e.rc, k, lane1.OrderID); st != string(flashgate.OrderConfirmed) {
		t.Errorf("lane order's record: %s", st)
	}
	if known, err := lua.IdemKnown(ctx(t), e.rc, k, "u1", "k1"); err != nil || !known {
		t.Errorf("k1 in Redis: %v, %v", known, err)
	}
	// The fast path: u1 is at the limit; u4 buys.
	now := time.Now()
	got, err := e.scripts.Admit(ctx(t), e.rc, k, lua.AdmitArgs{User: "u1", Quantity: 1, OrderID: nextID.Add(1), Now: now, PayBy: now.Add(time.Minute)})
	if err != nil || got.Outcome != lua.LimitReached {
		t.Fatalf("fast path, u1 after the lane: %v, %v", got.Outcome, err)
	}
	o4 := admit(t, e.rc, k, "u4", 2, "")
	// The stream drains: o1, o5 and o4 land.
	for _, o := range []flashgate.Order{o1, o5, o4} {
		if out := e.process(sale.ID, []flashgate.Order{o}); out[0].Status != flashgate.OrderConfirmed {
			t.Fatalf("%d: %+v", o.ID, out[0])
		}
	}
	rep := check(t, e, sale.ID, []uint64{o1.ID, o2.ID, lane1.OrderID, lane3.OrderID, o4.ID, o5.ID})
	if !rep.OK() || rep.Sold != 8 || rep.RedisRemaining != 2 {
		t.Fatalf("after the stream drained: %s", rep)
	}
	// Nothing stale: a second rewarm does nothing.
	if did, err := b.rewarm(ctx(t), sale.ID); did || err != nil {
		t.Fatalf("rewarm of a fresh sale: %v, %v", did, err)
	}
}

// The rewarm waits for Redis: while it does not answer the sale stays stale.
func TestRewarmWaitsForRedis(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	e := newEnv(t, []string{srv.Addr})
	b := idleBackend(t, e)
	sale := spec(5, 1, nil)
	sale.Degrade = flashgate.DegradeMySQL
	e.createSale(sale)
	now := time.Now().UTC().Truncate(time.Millisecond)
	r, err := mysql.DecideDegraded(ctx(t), e.db, mysql.LanePurchase{Order: flashgate.Order{SaleID: sale.ID, UserID: "u1",
		Quantity: 1, CreatedAt: now, ExpiresAt: now.Add(time.Minute)}, NextID: func() uint64 { return 42 }}, now)
	if err != nil || r.Outcome != flashgate.LaneAdmitted {
		t.Fatalf("lane: %+v, %v", r, err)
	}
	srv.Pause()
	c, cancel := context.WithTimeout(ctx(t), 2*time.Second)
	did, err := b.rewarm(c, sale.ID)
	cancel()
	srv.Resume()
	if did {
		t.Fatalf("rewarmed with Redis stopped (err %v)", err)
	}
	if st, err := mysql.StaleSales(ctx(t), e.db); err != nil || st[sale.ID] != 1 {
		t.Fatalf("stale sales %v, %v", st, err)
	}
	if did, err := b.rewarm(ctx(t), sale.ID); !did || err != nil {
		t.Fatalf("rewarm with Redis back: %v, %v", did, err)
	}
	if n := remaining(t, e.rc, lua.KeysFor(sale.ID, nil), ""); n != 4 {
		t.Fatalf("stock %d, want 4", n)
	}
}

// degrade and degrade_rate through the admin API (created, shown, refused
// when bad), into Redis's meta; and the lane's queue group answers a running
// backend's purchases: with Redis there and the sale fresh, "fresh".
func TestAdminDegradeAndLaneServed(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	tok := s.cfg.Admin.Token
	id := testenv.ID("dg")
	cleanRedisID(t, s.rc, id)
	if status, body := s.call("POST", "/admin/v1/sales", tok, saleBody(testenv.ID("dg"), 10, 2, `,"degrade":"redis"`)); status != 400 || body["code"] != "invalid_request" {
		t.Errorf("degrade redis: %d %v", status, body)
	}
	if status, body := s.call("POST", "/admin/v1/sales", tok, saleBody(testenv.ID("dg"), 10, 2, `,"degrade_rate":5`)); status != 400 {
		t.Errorf("degrade_rate without mysql: %d %v", status, body)
	}
	status, body := s.call("POST", "/admin/v1/sales", tok, saleBody(id, 10, 2, `,"degrade":"mysql","degrade_rate":8`))
	if status != 201 || body["degrade"] != "mysql" || body["degrade_rate"] != float64(8) {
		t.Fatalf("create: %d %v", status, body)
	}
	status, body = s.call("GET", "/admin/v1/sales/"+id, tok, "")
	if status != 200 || body["degrade"] != "mysql" || body["degrade_rate"] != float64(8) || body["stale"] != float64(0) {
		t.Errorf("show: %d %v", status, body)
	}
	if got, err := lua.LoadSale(ctx(t), s.rc, id); err != nil || got.Degrade != flashgate.DegradeMySQL || got.DegradeRate != 8 {
		t.Errorf("redis meta: %+v, %v", got, err)
	}
	plain := testenv.ID("dg")
	cleanRedisID(t, s.rc, plain)
	if status, _ := s.call("POST", "/admin/v1/sales", tok, saleBody(plain, 10, 2, "")); status != 201 {
		t.Fatalf("create plain: %d", status)
	}
	if _, body := s.call("GET", "/admin/v1/sales/"+plain, tok, ""); body["degrade"] != "closed" || body["degrade_rate"] != float64(0) {
		t.Errorf("show plain: %v", body)
	}

	now := time.Now()
	o := flashgate.Order{SaleID: id, UserID: "u1", Quantity: 1, CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
	r, err := bus.Purchase(ctx(t), s.nc, s.cfg.NATS, bus.PurchaseOf(&o))
	if err != nil || r.Outcome != string(flashgate.LaneFresh) {
		t.Fatalf("lane with Redis up: %+v, %v", r, err)
	}
	if n := s.rows(id, "confirmed"); n != 0 {
		t.Fatalf("a fresh answer wrote %d orders", n)
	}
}
