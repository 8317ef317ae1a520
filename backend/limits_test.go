package backend

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// MySQL's re-check of the purchase limits (limit_usage) and the limits'
// life cycle in the backend: cancel, warm.

// limitedSpec is an active sale of total units with a phone limit of 2 units a
// day and an address limit of 1 order for the whole sale, in Shanghai.
func limitedSpec(total int64) *flashgate.Sale {
	s := spec(total, total, nil)
	s.PerOrderMax = 2
	s.TimeZone = "Asia/Shanghai"
	s.Limits = []flashgate.Limit{
		{Dimension: flashgate.DimPhone, Max: 2, Per: flashgate.PerDay},
		{Dimension: flashgate.DimAddress, Max: 1, Of: flashgate.OfOrders},
	}
	if err := s.Validate(); err != nil {
		panic(err)
	}
	return s
}

// admitSub admits like a gateway for a buyer with subjects sub; the outcome
// must be Admitted.
func admitSub(t testing.TB, rc rueidis.Client, k *lua.Keys, s *flashgate.Sale, sub flashgate.Subjects, qty int64) flashgate.Order {
	t.Helper()
	now := time.Now()
	loc, _ := s.Location()
	cs, err := s.Charges(sub, qty, now, loc)
	if err != nil {
		t.Fatal(err)
	}
	a := lua.AdmitArgs{User: sub.User, Quantity: qty, OrderID: nextID.Add(1), Now: now, PayBy: now.Add(15 * time.Minute),
		Charges: cs, Limits: s.Limits}
	got, err := lua.Load().Admit(ctx(t), rc, k, a)
	if err != nil || got.Outcome != lua.Admitted {
		t.Fatalf("admit %+v: %+v, %v", sub, got, err)
	}
	return flashgate.Order{ID: got.OrderID, SaleID: k.Sale, UserID: sub.User, Quantity: qty, CreatedAt: ms(now.UnixMilli()),
		ExpiresAt: ms(a.PayBy.UnixMilli()), Charges: flashgate.EncodeCharges(cs),
		Phone: sub.Phone, Device: sub.Device, IP: sub.IP, Address: sub.Address}
}

func (e *env) used(sale string, lim int, window, subject string) int64 {
	return e.queryInt(`SELECT COALESCE(SUM(used), 0) FROM limit_usage WHERE sale_id = ? AND lim = ? AND window_id = ? AND subject = ?`,
		sale, lim, window, subject)
}

// redisCounter reads one limit counter from Redis.
func redisCounter(t testing.TB, rc rueidis.Client, k *lua.Keys, window string, lim int, subject string) int64 {
	t.Helper()
	n, err := rc.Do(ctx(t), rc.B().Hget().Key(k.Limit(window)).Field(strconv.Itoa(lim)+"/"+subject).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func dropLimitKeys(t testing.TB, rc rueidis.Client, k *lua.Keys, windows ...string) {
	t.Helper()
	for _, w := range windows {
		if err := rc.Do(ctx(t), rc.B().Del().Key(k.Limit(w)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
}

func today() string {
	loc, _ := time.LoadLocation("Asia/Shanghai")
	w, _ := flashgate.Window(flashgate.PerDay, time.Now(), loc)
	return w
}

// TestLimitsCounted: orders within the limits are written with their usage
// rows, and the audit finds usage and orders agreeing.
func TestLimitsCounted(t *testing.T) {
	t.Parallel()
	for _, target := range []struct {
		name  string
		addrs []string
	}{{"standalone", testenv.RedisAddrs()}, {"cluster", testenv.ClusterAddrs()}} {
		t.Run(target.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, target.addrs)
			s := limitedSpec(20)
			k := e.createSale(s)
			t.Cleanup(func() { dropLimitKeys(t, e.rc, k, "sale", today()) })
			msgs := []flashgate.Order{
				admitSub(t, e.rc, k, s, flashgate.Subjects{User: "u1", Phone: "+8613800000001", Address: "a1"}, 1),
				admitSub(t, e.rc, k, s, flashgate.Subjects{User: "u2", Phone: "+8613800000001", Address: "a2"}, 1),
				admitSub(t, e.rc, k, s, flashgate.Subjects{User: "u3", Phone: "+8613800000003", Address: "a3"}, 2),
			}
			for _, o := range e.process(s.ID, msgs) {
				if o.Status != flashgate.OrderConfirmed {
					t.Fatalf("%+v", o)
				}
			}
			day := today()
			if e.used(s.ID, 0, day, "+8613800000001") != 2 || e.used(s.ID, 0, day, "+8613800000003") != 2 ||
				e.used(s.ID, 1, "sale", "a1") != 1 || e.used(s.ID, 1, "sale", "a3") != 1 {
				t.Fatalf("limit_usage: %d %d %d %d", e.used(s.ID, 0, day, "+8613800000001"), e.used(s.ID, 0, day, "+8613800000003"),
					e.used(s.ID, 1, "sale", "a1"), e.used(s.ID, 1, "sale", "a3"))
			}
			if r := check(t, e, s.ID, ids(msgs)); !r.OK() || r.LiveUnits != 4 {
				t.Fatalf("audit: %v", r)
			}
		})
	}
}

// TestLimitSlippedPastRedis: Redis lost the limit counters, so it admits a
// phone's third and fourth unit of the day; MySQL's guard fails those orders
// with the dimension in the reason and their units go back to Redis. Both
// paths: a batch whose fast path refuses (then the fallback decides), and
// orders met one by one.
func TestLimitSlippedPastRedis(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{true, false} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, testenv.RedisAddrs())
			s := limitedSpec(20)
			k := e.createSale(s)
			day := today()
			t.Cleanup(func() { dropLimitKeys(t, e.rc, k, "sale", day) })
			phone := "+8613800000009"
			first := admitSub(t, e.rc, k, s, flashgate.Subjects{User: "u1", Phone: phone, Address: "a1"}, 2)
			if o := e.process(s.ID, []flashgate.Order{first}); o[0].Status != flashgate.OrderConfirmed {
				t.Fatalf("first: %+v", o)
			}
			dropLimitKeys(t, e.rc, k, "sale", day) // Redis forgets
			late := []flashgate.Order{
				admitSub(t, e.rc, k, s, flashgate.Subjects{User: "u2", Phone: phone, Address: "a2"}, 1),
				admitSub(t, e.rc, k, s, flashgate.Subjects{User: "u3", Phone: "+8613800000010", Address: "a1"}, 1), // address a1 again
				admitSub(t, e.rc, k, s, flashgate.Subjects{User: "u4", Phone: "+8613800000011", Address: "a4"}, 2), // fine
			}
			var out []outcome
			if batch {
				out = e.process(s.ID, late)
			} else {
				for _, m := range late {
					out = append(out, e.process(s.ID, []flashgate.Order{m})...)
				}
			}
			want := []struct{ status, reason string }{
				{"failed", "limit_reached:phone"}, {"failed", "limit_reached:address"}, {"confirmed", ""},
			}
			for i, o := range out {
				if string(o.Status) != want[i].status || o.Reason != want[i].reason {
					t.Errorf("order %d: %s/%s, want %s/%s", i, o.Status, o.Reason, want[i].status, want[i].reason)
				}
				if st, why := redisStatus(t, e.rc, k, late[i].ID); st != want[i].status || why != want[i].reason {
					t.Errorf("redis %d: %s/%s", i, st, why)
				}
			}
			// The failed orders' units and charges went back: Redis counts only
			// the one order that passed since it forgot.
			if got := remaining(t, e.rc, k, ""); got != 16 {
				t.Errorf("remaining %d, want 16", got)
			}
			if redisCounter(t, e.rc, k, day, 0, phone) != 0 || redisCounter(t, e.rc, k, "sale", 1, "a1") != 0 ||
				redisCounter(t, e.rc, k, day, 0, "+8613800000011") != 2 {
				t.Errorf("redis counters %d %d %d", redisCounter(t, e.rc, k, day, 0, phone),
					redisCounter(t, e.rc, k, "sale", 1, "a1"), redisCounter(t, e.rc, k, day, 0, "+8613800000011"))
			}
			if e.used(s.ID, 0, day, phone) != 2 || e.used(s.ID, 1, "sale", "a1") != 1 {
				t.Errorf("limit_usage %d %d", e.used(s.ID, 0, day, phone), e.used(s.ID, 1, "sale", "a1"))
			}
			r := check(t, e, s.ID, append(ids(late), first.ID))
			if !r.OK() || r.LiveUnits != 4 || r.ByStatus["failed"] != 2 {
				t.Errorf("audit: %v", r)
			}
		})
	}
}

// TestCancelUnchargesLimits: a canceled order's usage leaves MySQL and Redis,
// once, and the phone may buy again.
func TestCancelUnchargesLimits(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.ClusterAddrs(), nil)
	sale := limitedSpec(10)
	k := s.lifecycleSale(sale)
	day := today()
	t.Cleanup(func() { dropLimitKeys(t, s.rc, k, "sale", day) })
	sub := flashgate.Subjects{User: "u1", Phone: "+8613800000021", Address: "home"}
	m := admitSub(t, s.rc, k, sale, sub, 2)
	if o := s.process(sale.ID, []flashgate.Order{m}); o[0].Status != flashgate.OrderConfirmed {
		t.Fatalf("%+v", o)
	}
	for range 2 {
		wantReply(t, "cancel", s.command(bus.CmdCancel, m, "u1"), bus.ReplyOK, "canceled", flashgate.ReasonCanceled)
		if s.used(sale.ID, 0, day, sub.Phone) != 0 || s.used(sale.ID, 1, "sale", "home") != 0 {
			t.Fatalf("limit_usage after cancel: %d %d", s.used(sale.ID, 0, day, sub.Phone), s.used(sale.ID, 1, "sale", "home"))
		}
		if redisCounter(t, s.rc, k, day, 0, sub.Phone) != 0 || redisCounter(t, s.rc, k, "sale", 1, "home") != 0 {
			t.Fatal("redis counters after cancel")
		}
		s.auditOK(sale.ID)
	}
	// Another account at the same phone and address buys again: those limits came back with
	// the cancel (u1's own quota did not).
	again := admitSub(t, s.rc, k, sale, flashgate.Subjects{User: "u2", Phone: sub.Phone, Address: sub.Address}, 2)
	if o := s.process(sale.ID, []flashgate.Order{again}); o[0].Status != flashgate.OrderConfirmed {
		t.Fatalf("buying again: %+v", o)
	}
	s.auditOK(sale.ID)
}

// TestWarmRebuildsLimits: after Redis lost a sale, warming it rewrites the
// limit counters from limit_usage, each window with its expiry; a window that
// has ended is left out.
func TestWarmRebuildsLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.RedisAddrs())
	s := limitedSpec(10)
	k := e.createSale(s)
	day := today()
	t.Cleanup(func() { dropLimitKeys(t, e.rc, k, "sale", day) })
	sub := flashgate.Subjects{User: "u1", Phone: "+8613800000031", Address: "home"}
	m := admitSub(t, e.rc, k, s, sub, 2)
	if o := e.process(s.ID, []flashgate.Order{m}); o[0].Status != flashgate.OrderConfirmed {
		t.Fatalf("%+v", o)
	}
	if _, err := e.db.ExecContext(ctx(t), `INSERT INTO limit_usage (sale_id, lim, window_id, subject, dimension, used)
		VALUES (?, 0, 'd20200101', ?, 'phone', 2)`, s.ID, sub.Phone); err != nil {
		t.Fatal(err)
	}
	dropLimitKeys(t, e.rc, k, "sale", day)
	if err := e.rc.Do(ctx(t), e.rc.B().Del().Key(k.Meta).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if did, err := e.warmer.warm(context.Background(), s.ID); err != nil || !did {
		t.Fatalf("warm: %v %v", did, err)
	}
	if redisCounter(t, e.rc, k, day, 0, sub.Phone) != 2 || redisCounter(t, e.rc, k, "sale", 1, "home") != 1 {
		t.Fatalf("rebuilt counters %d %d", redisCounter(t, e.rc, k, day, 0, sub.Phone), redisCounter(t, e.rc, k, "sale", 1, "home"))
	}
	if n, _ := e.rc.Do(ctx(t), e.rc.B().Exists().Key(k.Limit("d20200101")).Build()).AsInt64(); n != 0 {
		t.Fatal("an ended window was rebuilt")
	}
	if ttl, _ := e.rc.Do(ctx(t), e.rc.B().Pttl().Key(k.Limit(day)).Build()).AsInt64(); ttl <= int64(time.Hour/time.Millisecond) {
		t.Fatalf("day counter TTL %d ms", ttl)
	}
	// The rebuilt counters refuse what MySQL would.
	loc, _ := s.Location()
	cs, _ := s.Charges(flashgate.Subjects{User: "u9", Phone: sub.Phone, Address: "elsewhere"}, 1, time.Now(), loc)
	got, err := lua.Load().Admit(ctx(t), e.rc, k, lua.AdmitArgs{User: "u9", Quantity: 1, OrderID: nextID.Add(1), Now: time.Now(),
		PayBy: time.Now().Add(time.Minute), Charges: cs, Limits: s.Limits})
	if err != nil || got.Outcome != lua.LimitReached || got.Limit != 0 {
		t.Fatalf("admit after rebuild: %+v %v", got, err)
	}
}

// TestWarmRestoresInFlightCharges: Redis restarts empty while an order with a
// phone charge is in the stream, not yet in MySQL. The warm counts it again,
// as it counts its buyer's units: the phone's counter is MySQL's plus the
// order in flight, so the phone's next buyer is refused by Redis (not
// admitted with a 202 that MySQL's guard then fails), and once the stream
// drained the counter equals MySQL's. Fails with the in-flight charges left
// out of the warm.
func TestWarmRestoresInFlightCharges(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	e := newEnv(t, []string{srv.Addr})
	r := idleBackend(t, e)
	sale := limitedSpec(10)
	k := e.createSale(sale)
	loc, _ := sale.Location()
	day, _ := flashgate.Window(flashgate.PerDay, time.Now(), loc)

	done := admitSub(t, e.rc, k, sale, flashgate.Subjects{User: "u1", Phone: "13800000001", Address: "a1"}, 1)
	e.process(sale.ID, []flashgate.Order{done})
	flying := admitSub(t, e.rc, k, sale, flashgate.Subjects{User: "u2", Phone: "13800000001", Address: "a2"}, 1)
	publishTo(t, r.js, e, flying)

	srv.Kill()
	srv.Start() // empty: no persistence
	eventually(t, 10*time.Second, "redis back", func() bool {
		return e.rc.Do(context.Background(), e.rc.B().Ping().Build()).Error() == nil
	})
	eventually(t, 10*time.Second, "a reconcile on the restarted Redis", func() bool {
		rep, err := r.Reconcile(ctx(t), sale.ID)
		return err == nil && rep.Rewarmed
	})
	if got := redisCounter(t, e.rc, k, day, 0, "13800000001"); got != 2 {
		t.Fatalf("phone counter after the warm: %d, want 2 (1 in MySQL + 1 in flight)", got)
	}
	if got := redisCounter(t, e.rc, k, "sale", 1, "a2"); got != 1 {
		t.Fatalf("address a2's counter after the warm: %d, want 1 (its order is in flight)", got)
	}
	// The phone is at its limit: a third buyer on it is refused in Redis.
	now := time.Now()
	cs, err := sale.Charges(flashgate.Subjects{User: "u3", Phone: "13800000001", Address: "a3"}, 1, now, loc)
	if err != nil {
		t.Fatal(err)
	}
	got, err := lua.Load().Admit(ctx(t), e.rc, k, lua.AdmitArgs{User: "u3", Quantity: 1, OrderID: nextID.Add(1), Now: now,
		PayBy: now.Add(time.Minute), Charges: cs, Limits: sale.Limits})
	if err != nil || got.Outcome != lua.LimitReached {
		t.Fatalf("third buyer on the phone: %+v, %v; want limit_reached", got, err)
	}

	// A backend drains the stream: the order in flight is confirmed, and
	// Redis's counter is MySQL's.
	s, err := dialAndStart(t, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	eventually(t, 15*time.Second, "the order in flight written", func() bool {
		st, _, _ := e.order(flying.ID)
		return st == "confirmed"
	})
	if db, rd := e.used(sale.ID, 0, day, "13800000001"), redisCounter(t, e.rc, k, day, 0, "13800000001"); db != 2 || rd != 2 {
		t.Fatalf("phone after the drain: MySQL %d, Redis %d; want 2 and 2", db, rd)
	}
	if r := check(t, e, sale.ID, []uint64{done.ID, flying.ID}); !r.OK() {
		t.Fatalf("audit: %v", r)
	}
}
