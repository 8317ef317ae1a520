package backend

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

func TestFastPath(t *testing.T) {
	t.Parallel()
	for _, target := range []struct {
		name  string
		addrs []string
	}{{"standalone", testenv.RedisAddrs()}, {"cluster", testenv.ClusterAddrs()}} {
		t.Run(target.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, target.addrs)
			s := spec(10, 3, nil)
			k := e.createSale(s)
			msgs := []flashgate.Order{
				admit(t, e.rc, k, "u1", 2, ""),
				admit(t, e.rc, k, "u2", 1, ""),
				admit(t, e.rc, k, "u3", 3, ""),
				admit(t, e.rc, k, "u1", 1, ""),
			}
			if n := reservations(t, e.rc, k); n != 4 {
				t.Fatalf("before: %d reservations, want 4", n)
			}
			for i, o := range e.process(s.ID, msgs) {
				if o.ID != msgs[i].ID || o.Status != flashgate.OrderConfirmed || o.Dropped || o.Existed {
					t.Errorf("outcome %d: %+v", i, o)
				}
			}
			if got := e.rows(s.ID, "confirmed"); got != 4 {
				t.Errorf("confirmed rows = %d, want 4", got)
			}
			if got := e.sold(s.ID); got != 7 {
				t.Errorf("sold = %d, want 7", got)
			}
			for user, want := range map[string]int64{"u1": 3, "u2": 1, "u3": 3} {
				if got := e.units(s.ID, user); got != want {
					t.Errorf("user_purchases %s = %d, want %d", user, got, want)
				}
			}
			if n := reservations(t, e.rc, k); n != 0 {
				t.Errorf("after: %d reservations, want 0", n)
			}
			for _, m := range msgs {
				if st, _ := redisStatus(t, e.rc, k, m.ID); st != "confirmed" {
					t.Errorf("redis status of %d = %q, want confirmed", m.ID, st)
				}
			}
			if r := check(t, e, s.ID, ids(msgs)); !r.OK() || r.LiveUnits != 7 || r.RedisRemaining != 3 || r.DistinctBuyers != 3 {
				t.Errorf("audit: %v", r)
			}
		})
	}
}

// Redis admitted more than MySQL allows: the guard holds the line.
func TestFallbackSoldOut(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.RedisAddrs())
	s := spec(5, 1, nil)
	if err := insertSale(ctx(t), e.db, s, s.StartsAt); err != nil {
		t.Fatal(err)
	}
	k := e.warmWith(s, map[string]int64{"": 8})
	var msgs []flashgate.Order
	for i := range 8 {
		msgs = append(msgs, admit(t, e.rc, k, fmt.Sprintf("u%d", i), 1, ""))
	}
	// Two batches: the first passes the fast path, the second takes the fallback.
	out := append(e.process(s.ID, msgs[:4]), e.process(s.ID, msgs[4:])...)
	for i, o := range out {
		want, reason := flashgate.OrderConfirmed, ""
		if i >= 5 {
			want, reason = flashgate.OrderFailed, flashgate.ReasonSoldOut
		}
		if o.Status != want || o.Reason != reason {
			t.Errorf("order %d: %s/%s, want %s/%s", i, o.Status, o.Reason, want, reason)
		}
		if st, why, _ := e.order(msgs[i].ID); st != string(want) || why != reason {
			t.Errorf("row %d: %s/%s, want %s/%s", i, st, why, want, reason)
		}
		if st, why := redisStatus(t, e.rc, k, msgs[i].ID); st != string(want) || why != reason {
			t.Errorf("redis %d: %s/%s, want %s/%s", i, st, why, want, reason)
		}
	}
	if got := e.sold(s.ID); got != 5 {
		t.Errorf("sold = %d, want 5", got)
	}
	// The failed orders' units went back to Redis (and the buyers' counters).
	if got := remaining(t, e.rc, k, ""); got != 3 {
		t.Errorf("redis remaining = %d, want 3", got)
	}
	if n := reservations(t, e.rc, k); n != 0 {
		t.Errorf("%d reservations left", n)
	}
	r := check(t, e, s.ID, ids(msgs))
	if r.Oversold != 0 || r.Duplicated != 0 || r.Lost != 0 || r.OverLimitUsers != 0 || r.LiveUnits != 5 || r.ByStatus["failed"] != 3 {
		t.Errorf("audit: %v", r)
	}
	// Redis was warmed with 3 units too many: the ledger says so.
	if r.LedgerHolds || r.LedgerDiff != 3 {
		t.Errorf("ledger: holds=%v diff=%d, want false/3", r.LedgerHolds, r.LedgerDiff)
	}
}

// A buyer's limit that slipped past Redis (its counter lost) fails in MySQL;
// the rest of the batch is written.
func TestFallbackLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.RedisAddrs())
	s := spec(10, 2, nil)
	k := e.createSale(s)
	first := admit(t, e.rc, k, "u1", 2, "")
	e.process(s.ID, []flashgate.Order{first})
	// Redis forgets what u1 holds, so it admits u1 again.
	if err := e.rc.Do(ctx(t), e.rc.B().Hdel().Key(k.Users).Field("u1").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	batch := []flashgate.Order{admit(t, e.rc, k, "u1", 1, ""), admit(t, e.rc, k, "u2", 2, "")}
	out := e.process(s.ID, batch)
	if out[0].Status != flashgate.OrderFailed || out[0].Reason != flashgate.ReasonLimitReached {
		t.Errorf("u1's second order: %+v, want failed limit_reached", out[0])
	}
	if out[1].Status != flashgate.OrderConfirmed {
		t.Errorf("u2's order: %+v, want confirmed", out[1])
	}
	if got := e.units(s.ID, "u1"); got != 2 {
		t.Errorf("u1 units = %d, want 2", got)
	}
	if got := e.units(s.ID, "u2"); got != 2 {
		t.Errorf("u2 units = %d, want 2", got)
	}
	if got := e.sold(s.ID); got != 4 {
		t.Errorf("sold = %d, want 4", got)
	}
	if st, why := redisStatus(t, e.rc, k, batch[0].ID); st != "failed" || why != flashgate.ReasonLimitReached {
		t.Errorf("redis: %s/%s", st, why)
	}
	if r := check(t, e, s.ID, append(ids(batch), first.ID)); !r.OK() || r.OverLimitUsers != 0 {
		t.Errorf("audit: %v", r)
	}
}

// The region guard: Redis thinks bj has 5, MySQL knows it has 3.
func TestFallbackRegion(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.ClusterAddrs())
	s := spec(5, 5, map[string]int64{"bj": 3, "sh": 2})
	if err := insertSale(ctx(t), e.db, s, s.StartsAt); err != nil {
		t.Fatal(err)
	}
	k := e.warmWith(s, map[string]int64{"bj": 5, "sh": 2})
	var msgs []flashgate.Order
	for i := range 4 {
		msgs = append(msgs, admit(t, e.rc, k, fmt.Sprintf("b%d", i), 1, "bj"))
	}
	msgs = append(msgs, admit(t, e.rc, k, "s0", 1, "sh"))
	out := e.process(s.ID, msgs)
	for i, o := range out {
		want := flashgate.OrderConfirmed
		if i == 3 {
			want = flashgate.OrderFailed
		}
		if o.Status != want {
			t.Errorf("order %d (%s): %+v, want %s", i, msgs[i].Region, o, want)
		}
	}
	if out[3].Reason != flashgate.ReasonSoldOut {
		t.Errorf("reason = %q", out[3].Reason)
	}
	bj := e.queryInt(`SELECT sold FROM sale_regions WHERE sale_id = ? AND region = 'bj'`, s.ID)
	sh := e.queryInt(`SELECT sold FROM sale_regions WHERE sale_id = ? AND region = 'sh'`, s.ID)
	if bj != 3 || sh != 1 || e.sold(s.ID) != 4 {
		t.Errorf("sold bj=%d sh=%d total=%d, want 3 1 4", bj, sh, e.sold(s.ID))
	}
	if got := remaining(t, e.rc, k, "bj"); got != 2 { // 5 − 4 admitted + 1 released
		t.Errorf("redis bj remaining = %d, want 2", got)
	}
	if r := check(t, e, s.ID, ids(msgs)); r.Oversold != 0 || r.Duplicated != 0 || r.Lost != 0 {
		t.Errorf("audit: %v", r)
	}
}

func TestIdempotent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.RedisAddrs())
	s := spec(100, 5, nil)
	k := e.createSale(s)

	t.Run("redelivery", func(t *testing.T) {
		msgs := []flashgate.Order{admit(t, e.rc, k, "a", 2, ""), admit(t, e.rc, k, "b", 1, "")}
		e.process(s.ID, msgs)
		// The same message twice in one batch, and the whole batch again.
		again := append(msgs, msgs[0])
		for i, o := range e.process(s.ID, again) {
			if !o.Existed || o.Status != flashgate.OrderConfirmed || o.ID != again[i].ID {
				t.Errorf("redelivered %d: %+v", i, o)
			}
		}
		if n := e.queryInt(`SELECT COUNT(*) FROM orders WHERE id IN (?, ?)`, msgs[0].ID, msgs[1].ID); n != 2 {
			t.Errorf("%d rows, want 2", n)
		}
		if got := e.units(s.ID, "a"); got != 2 {
			t.Errorf("a units = %d, want 2", got)
		}
	})

	t.Run("concurrent", func(t *testing.T) {
		var all []flashgate.Order
		for round := range 5 {
			var msgs []flashgate.Order
			for u := range 4 {
				msgs = append(msgs, admit(t, e.rc, k, fmt.Sprintf("c%d-%d", round, u), 1, ""))
			}
			all = append(all, msgs...)
			var wg sync.WaitGroup
			errs := make(chan error, 2)
			for range 2 {
				wg.Go(func() {
					if _, err := e.w.process(ctx(t), s.ID, msgs); err != nil {
						errs <- err
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("round %d: %v", round, err)
			}
		}
		if n := e.queryInt(`SELECT COUNT(*) FROM orders WHERE sale_id = ? AND user_id LIKE 'c%'`, s.ID); n != int64(len(all)) {
			t.Errorf("%d rows, want %d", n, len(all))
		}
	})

	t.Run("failed redelivered releases once", func(t *testing.T) {
		s := spec(1, 1, nil)
		if err := insertSale(ctx(t), e.db, s, s.StartsAt); err != nil {
			t.Fatal(err)
		}
		k := e.warmWith(s, map[string]int64{"": 2})
		msgs := []flashgate.Order{admit(t, e.rc, k, "x", 1, ""), admit(t, e.rc, k, "y", 1, "")}
		e.process(s.ID, msgs)
		before := remaining(t, e.rc, k, "")
		out := e.process(s.ID, msgs)
		if !out[1].Existed || out[1].Status != flashgate.OrderFailed || out[1].Reason != flashgate.ReasonSoldOut {
			t.Errorf("redelivered failed order: %+v", out[1])
		}
		if after := remaining(t, e.rc, k, ""); after != before || after != 1 {
			t.Errorf("redis remaining %d then %d, want 1 both times", before, after)
		}
	})

	if got, want := e.sold(s.ID), int64(3+20); got != want {
		t.Errorf("sold = %d, want %d", got, want)
	}
	if r := check(t, e, s.ID, nil); !r.OK() {
		t.Errorf("audit: %v", r)
	}
}

// An order the gateway released (its publish failed, the buyer got 503) is
// dropped: no row, nothing counted.
func TestReleasedDropped(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.RedisAddrs())
	s := spec(10, 2, nil)
	k := e.createSale(s)
	gone, kept := admit(t, e.rc, k, "u1", 1, ""), admit(t, e.rc, k, "u2", 1, "")
	r, err := e.scripts.Release(ctx(t), e.rc, k, gone.ID, "", "", lua.ReleaseGateway, flashgate.ReasonPublishFailed)
	if err != nil || !r.Released {
		t.Fatalf("release: %+v %v", r, err)
	}
	out := e.process(s.ID, []flashgate.Order{gone, kept})
	if !out[0].Dropped || out[1].Status != flashgate.OrderConfirmed {
		t.Errorf("outcomes: %+v", out)
	}
	if _, _, ok := e.order(gone.ID); ok {
		t.Error("the released order has a row")
	}
	if e.sold(s.ID) != 1 {
		t.Errorf("sold = %d, want 1", e.sold(s.ID))
	}
	if st, _ := redisStatus(t, e.rc, k, gone.ID); st != "released" {
		t.Errorf("redis status = %q, want released", st)
	}
	if r := check(t, e, s.ID, []uint64{kept.ID}); !r.OK() {
		t.Errorf("audit: %v", r)
	}
}

func TestUnknownAndClosed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.RedisAddrs())

	t.Run("sale MySQL does not know", func(t *testing.T) {
		s := spec(10, 2, nil)
		k := e.warmWith(s, map[string]int64{"": 10})
		m := admit(t, e.rc, k, "u1", 2, "")
		out := e.process(s.ID, []flashgate.Order{m})
		if out[0].Status != flashgate.OrderFailed || out[0].Reason != flashgate.ReasonUnknownSale {
			t.Errorf("outcome: %+v", out[0])
		}
		if st, why, ok := e.order(m.ID); !ok || st != "failed" || why != flashgate.ReasonUnknownSale {
			t.Errorf("row: %s/%s/%v", st, why, ok)
		}
		if got := remaining(t, e.rc, k, ""); got != 10 {
			t.Errorf("redis remaining = %d, want 10 (released)", got)
		}
	})

	t.Run("id of another sale's order", func(t *testing.T) {
		// Two id generators on one node made one id for orders of two
		// sales; the first is in MySQL. The second is not that row: it
		// fails (order_id_taken, no row of its own) and its units go back,
		// never confirmed with the other order's status.
		sa, sb := spec(10, 2, nil), spec(10, 2, nil)
		ka, kb := e.createSale(sa), e.createSale(sb)
		first := admit(t, e.rc, ka, "u1", 1, "")
		if out := e.process(sa.ID, []flashgate.Order{first}); out[0].Status != flashgate.OrderConfirmed {
			t.Fatalf("the first order: %+v", out[0])
		}
		now := time.Now()
		a := lua.AdmitArgs{User: "u2", Quantity: 2, OrderID: first.ID, Now: now, PayBy: now.Add(time.Minute)}
		if adm, err := lua.Load().Admit(ctx(t), e.rc, kb, a); err != nil || adm.Outcome != lua.Admitted {
			t.Fatalf("admit the second: %+v %v", adm, err)
		}
		second := flashgate.Order{ID: first.ID, SaleID: sb.ID, UserID: "u2", Quantity: 2, Status: flashgate.OrderPending,
			CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
		out := e.process(sb.ID, []flashgate.Order{second})
		if out[0].Status != flashgate.OrderFailed || out[0].Reason != flashgate.ReasonIDTaken {
			t.Fatalf("the second order: %+v, want failed %s", out[0], flashgate.ReasonIDTaken)
		}
		if e.sold(sb.ID) != 0 || e.sold(sa.ID) != 1 {
			t.Errorf("sold: %s %d, %s %d; want 0, 1", sb.ID, e.sold(sb.ID), sa.ID, e.sold(sa.ID))
		}
		if got := remaining(t, e.rc, kb, ""); got != 10 {
			t.Errorf("redis remaining of the second sale = %d, want 10 (released)", got)
		}
		if st, _, ok := e.order(first.ID); !ok || st != "confirmed" {
			t.Errorf("the first order's row: %s %v, want confirmed", st, ok)
		}
	})

	t.Run("closed sale", func(t *testing.T) {
		// Admitted before the close (within closeGrace of it: the gateway's
		// clock may run ahead of the closing backend's): a 202 given, written.
		s := spec(10, 2, nil)
		k := e.createSale(s)
		early := admit(t, e.rc, k, "u1", 1, "")
		if err := closeSaleRow(ctx(t), e.db, s.ID, early.CreatedAt.Add(-closeGrace/2)); err != nil {
			t.Fatal(err)
		}
		out := e.process(s.ID, []flashgate.Order{early})
		if out[0].Status != flashgate.OrderConfirmed || e.sold(s.ID) != 1 {
			t.Errorf("an order admitted before the close: %+v, sold %d", out[0], e.sold(s.ID))
		}
		// Stamped well after the close: a Redis that never heard of it.
		s2 := spec(10, 2, nil)
		k2 := e.createSale(s2)
		late := admit(t, e.rc, k2, "u1", 1, "")
		if err := closeSaleRow(ctx(t), e.db, s2.ID, late.CreatedAt.Add(-2*closeGrace)); err != nil {
			t.Fatal(err)
		}
		out = e.process(s2.ID, []flashgate.Order{late})
		if out[0].Status != flashgate.OrderFailed || out[0].Reason != flashgate.ReasonSaleClosed {
			t.Errorf("an order admitted after the close: %+v", out[0])
		}
		if e.sold(s2.ID) != 0 {
			t.Errorf("sold = %d", e.sold(s2.ID))
		}
	})

	t.Run("Redis lost the order", func(t *testing.T) {
		s := spec(10, 2, nil)
		// Admitted a second before the sale's last rebuild (createSale's warm),
		// by a Redis that lost it: written, MySQL's guards decide.
		at := time.Now().Add(-time.Second)
		m := flashgate.Order{ID: idAt(at), SaleID: s.ID, UserID: "u9", Quantity: 1, CreatedAt: ms(at.UnixMilli()), ExpiresAt: ms(2)}
		k := e.createSale(s)
		out := e.process(s.ID, []flashgate.Order{m})
		if out[0].Status != flashgate.OrderConfirmed {
			t.Errorf("outcome: %+v", out[0])
		}
		if st, _ := redisStatus(t, e.rc, k, m.ID); st != "confirmed" {
			t.Errorf("redis status = %q, want confirmed (rewritten)", st)
		}
		// One made after the rebuild was never admitted.
		now := time.Now()
		late := flashgate.Order{ID: idAt(now), SaleID: s.ID, UserID: "u8", Quantity: 1, CreatedAt: ms(now.UnixMilli())}
		out = e.process(s.ID, []flashgate.Order{late})
		if out[0].Status != flashgate.OrderFailed || out[0].Reason != flashgate.ReasonUnadmitted {
			t.Errorf("an order Redis never admitted: %+v", out[0])
		}
		if e.sold(s.ID) != 1 {
			t.Errorf("sold = %d, want 1", e.sold(s.ID))
		}
	})

	t.Run("region the sale does not have", func(t *testing.T) {
		s := spec(10, 2, nil)
		k := e.createSale(s)
		good := admit(t, e.rc, k, "u1", 1, "")
		bad := good
		bad.ID, bad.Region = nextID.Add(1), "zz"
		out := e.process(s.ID, []flashgate.Order{good, bad})
		if out[0].Status != flashgate.OrderConfirmed || out[1].Status != flashgate.OrderFailed || out[1].Reason != reasonUnknownRegion {
			t.Errorf("outcomes: %+v", out)
		}
	})
}
