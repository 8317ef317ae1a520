package backend

import (
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
)

// loseRedis deletes everything Redis holds of sale (one key at a time: a
// split sale's keys are on several slots), as a Redis that lost its data; with
// tags, only the keys on the same Cluster master as one of theirs, as that
// master restarting empty.
func loseRedis(t *testing.T, rc rueidis.Client, sale *flashgate.Sale, tags ...*lua.Keys) {
	t.Helper()
	var keys []string
	if len(tags) == 0 {
		keys = lua.AllKeys(sale)
	} else {
		master := masterOf(t, rc)
		lost := map[string]bool{}
		for _, tg := range tags {
			lost[master(tg.Meta)] = true
		}
		for _, key := range lua.AllKeys(sale) {
			if lost[master(key)] {
				keys = append(keys, key)
			}
		}
	}
	cmds := make(rueidis.Commands, len(keys))
	for i, key := range keys {
		cmds[i] = rc.B().Del().Key(key).Build()
	}
	if err := sendAll(ctx(t), rc, cmds); err != nil {
		t.Fatal(err)
	}
}

// masterOf maps a key to the address of the Cluster master serving its slot.
func masterOf(t *testing.T, rc rueidis.Client) func(key string) string {
	t.Helper()
	res, err := rc.Do(ctx(t), rc.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		t.Fatalf("cluster slots: %v", err)
	}
	type span struct {
		lo, hi int64
		addr   string
	}
	var spans []span
	for _, r := range res {
		v, err := r.ToArray()
		if err != nil || len(v) < 3 {
			t.Fatalf("cluster slots: %v", err)
		}
		lo, _ := v[0].AsInt64()
		hi, _ := v[1].AsInt64()
		node, _ := v[2].ToArray()
		host, _ := node[0].ToString()
		port, _ := node[1].AsInt64()
		spans = append(spans, span{lo, hi, host + ":" + strconv.FormatInt(port, 10)})
	}
	return func(key string) string {
		slot := int64(lua.Slot(key))
		for _, s := range spans {
			if slot >= s.lo && slot <= s.hi {
				return s.addr
			}
		}
		t.Fatalf("no master serves slot %d", slot)
		return ""
	}
}

// Finding 1 of the rebuild issue: a rebuild after a cancel left the restocked
// set out, so the leader's restock pass, an operator's reconcile and the
// buyer repeating the cancel each gave the canceled units back again.
func TestRebuildAfterCancelsRestocksOnce(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	sale := spec(6, 2, nil)
	k := s.lifecycleSale(sale)
	a := s.confirmed(k, "u1", 2, "")
	s.confirmed(k, "u2", 1, "")
	wantReply(t, "cancel", s.command(bus.CmdCancel, a, "u1"), bus.ReplyOK, "canceled", flashgate.ReasonCanceled)
	if got := remaining(t, s.rc, k, ""); got != 5 {
		t.Fatalf("remaining after the cancel %d, want 5", got)
	}
	loseRedis(t, s.rc, sale)
	if _, err := s.b.warmer.warm(ctx(t), sale.ID); err != nil {
		t.Fatal(err)
	}
	want := func(when string) {
		t.Helper()
		// u1's quota stays taken after the cancel (the units do not), and the
		// rebuild keeps it so (user_purchases).
		if got, u1 := remaining(t, s.rc, k, ""), held(t, s.rc, k, "u1"); got != 5 || u1 != 2 {
			t.Fatalf("%s: remaining %d, u1 holds %d; want 5 and 2", when, got, u1)
		}
		s.auditOK(sale.ID)
	}
	want("after the rebuild")
	if n, err := s.b.life.restockCanceled(ctx(t), sale.ID, time.Time{}); err != nil || n != 0 {
		t.Fatalf("the leader's restock pass restocked %d (%v), want 0", n, err)
	}
	want("after the leader's pass")
	rep, err := s.b.Reconcile(ctx(t), sale.ID)
	if err != nil || rep.Restocked != 0 || !rep.Invariant3Holds {
		t.Fatalf("operator's reconcile: %+v %v", rep, err)
	}
	want("after the operator's reconcile")
	wantReply(t, "cancel again", s.command(bus.CmdCancel, a, "u1"), bus.ReplyOK, "canceled", flashgate.ReasonCanceled)
	want("after the buyer canceled again")
}

// A write-back of a decision a rebuild counted already is refused by the
// scripts, and so is any write-back while a rebuild is under way.
func TestWriteBackFromOlderEpochRefused(t *testing.T) {
	t.Parallel()
	for _, tg := range testenv.RedisTargets(t) {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, tg.Addrs)
			sale := spec(5, 2, nil)
			k := e.createSale(sale)
			m := admit(t, e.rc, k, "u1", 1, "")
			// MySQL decides the order; its write-back is late.
			res, err := e.w.writeRetrying(ctx(t), sale.ID, []flashgate.Order{m})
			if err != nil || res[m.ID].status != flashgate.OrderConfirmed {
				t.Fatalf("write: %+v %v", res, err)
			}
			old, err := mysql.SaleEpoch(ctx(t), e.db, sale.ID)
			if err != nil {
				t.Fatal(err)
			}
			rep, err := e.warmer.rebuild(ctx(t), sale.ID, nil)
			if err != nil || rep.Epoch != old+1 || rep.Pending != 0 {
				t.Fatalf("rebuild: %+v %v (epoch before %d)", rep, err, old)
			}
			if reservations(t, e.rc, k) != 0 || remaining(t, e.rc, k, "") != 4 {
				t.Fatalf("after the rebuild: %d reservations, remaining %d; want 0, 4", reservations(t, e.rc, k), remaining(t, e.rc, k, ""))
			}
			done := m
			done.Status = flashgate.OrderConfirmed
			if _, err := e.scripts.Confirm(ctx(t), e.rc, k.AtEpoch(old), []flashgate.Order{done}); !errors.Is(err, lua.ErrStaleEpoch) {
				t.Fatalf("confirm from epoch %d: %v, want ErrStaleEpoch", old, err)
			}
			r, err := e.scripts.Release(ctx(t), e.rc, k.AtEpoch(old), m.ID, "", "", lua.ReleaseBackend, flashgate.ReasonSoldOut)
			if err != nil || r.Outcome != lua.ReleaseFenced {
				t.Fatalf("release from epoch %d: %+v %v, want fenced", old, r, err)
			}
			canceled := m
			canceled.Status, canceled.Reason = flashgate.OrderCanceled, flashgate.ReasonCanceled
			out, err := e.scripts.RestockMany(ctx(t), e.rc, k.AtEpoch(old), []flashgate.Order{canceled})
			if err != nil || out[0] != lua.RestockFenced {
				t.Fatalf("restock from epoch %d: %v %v, want fenced", old, out, err)
			}
			if got := remaining(t, e.rc, k, ""); got != 4 {
				t.Fatalf("remaining %d after refused write-backs, want 4", got)
			}
			if st, _ := redisStatus(t, e.rc, k, m.ID); st != "confirmed" {
				t.Fatalf("record %q, want MySQL's confirmed", st)
			}
			// The current epoch writes back.
			if _, err := e.scripts.Confirm(ctx(t), e.rc, k.AtEpoch(rep.Epoch), []flashgate.Order{done}); err != nil {
				t.Fatalf("confirm from the current epoch: %v", err)
			}
			// While a rebuild is under way, nothing writes back.
			if err := lua.Fence(ctx(t), e.rc, k, rep.Epoch+1); err != nil {
				t.Fatal(err)
			}
			if _, err := e.scripts.Confirm(ctx(t), e.rc, k.AtEpoch(rep.Epoch), []flashgate.Order{done}); !errors.Is(err, lua.ErrStaleEpoch) {
				t.Fatalf("confirm during a rebuild: %v, want ErrStaleEpoch", err)
			}
			if a, err := e.scripts.Admit(ctx(t), e.rc, k, lua.AdmitArgs{User: "u9", Quantity: 1, OrderID: nextID.Add(1), Now: time.Now(),
				PayBy: time.Now().Add(time.Hour)}); err != nil || a.Outcome != lua.NotWarmed {
				t.Fatalf("admission during a rebuild: %+v %v, want not_warmed", a, err)
			}
		})
	}
}

// Finding 4 of the rebuild issue: a rebuild racing the write of an order
// MySQL fails. While the rebuild is under way (its tags fenced, the sale row
// locked) the writer decides nothing: its claim answers cold and the batch
// waits, so no decision can fall between the rebuild's read and its install.
// Once the rebuild is in, the write fails the order, and its write-back finds
// the reservation the rebuild kept: the units come back once, and no
// reservation of a failed order is left behind.
func TestRebuildRacesFailedWrite(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.RedisAddrs())
	sale := spec(3, 3, nil)
	k := e.createSale(sale)
	m := admit(t, e.rc, k, "u1", 2, "")
	// The sale closed before the order was admitted, as MySQL sees it: the
	// writer fails it (sale_closed).
	if _, err := e.db.ExecContext(ctx(t), `UPDATE sales SET closed = 1, closed_at = ? WHERE id = ?`,
		m.CreatedAt.Add(-2*closeGrace), sale.ID); err != nil {
		t.Fatal(err)
	}
	paused, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.warmer.afterFence = func() {
		once.Do(func() {
			close(paused)
			<-resume
		})
	}
	rebuilt := make(chan error, 1)
	go func() {
		_, err := e.warmer.rebuild(ctx(t), sale.ID, nil)
		rebuilt <- err
	}()
	<-paused
	// Fenced: the writer's claim answers cold, and nothing is decided.
	if _, err := e.w.process(ctx(t), sale.ID, []flashgate.Order{m}); !errors.Is(err, errSaleCold) || !unavailable(err) {
		t.Fatalf("a write during the rebuild: %v, want the sale cold (an outage: the batch waits)", err)
	}
	if _, _, ok := e.order(m.ID); ok {
		t.Fatal("MySQL decided the order while the rebuild was under way")
	}
	close(resume)
	if err := <-rebuilt; err != nil {
		t.Fatal(err)
	}
	if n := reservations(t, e.rc, k); n != 1 {
		t.Fatalf("%d reservations after the rebuild, want the order in flight kept", n)
	}
	out := e.process(sale.ID, []flashgate.Order{m})
	if out[0].Status != flashgate.OrderFailed {
		t.Fatalf("order %+v, want failed", out[0])
	}
	if n := reservations(t, e.rc, k); n != 0 {
		t.Fatalf("%d reservations left behind, want 0", n)
	}
	if got := remaining(t, e.rc, k, ""); got != 3 {
		t.Fatalf("remaining %d, want 3 (the failed order's units back, once)", got)
	}
	if r := check(t, e, sale.ID, nil); !r.OK() {
		t.Fatalf("audit: %v", r)
	}
}

// Findings 5 and 6 of the rebuild issue, on a split sale: the master holding
// the sale's own meta is lost (with the buckets it serves), then one holding
// only buckets. Each time
// orders are in flight (one reserved in Redis, one only in the stream), and a
// retry of an idempotency key answers the order it made; the stock of every
// bucket adds up to MySQL's, less what is in flight.
func TestSplitSaleLosesOneMaster(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.ClusterAddrs())
	r := idleBackend(t, e)
	sale := spec(40, 4, nil)
	k := e.createSplitSale(sale, 3)
	idem := func(user, key string, qty int64) lua.Admission {
		t.Helper()
		now := time.Now()
		a, err := e.scripts.AdmitBucketed(ctx(t), e.rc, k, lua.AdmitArgs{User: user, Quantity: qty, OrderID: nextID.Add(1), Now: now,
			IdemKey: key, PayBy: now.Add(15 * time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	// A bucket on another master than the sale's meta.
	master := masterOf(t, e.rc)
	var other *lua.Keys
	for _, b := range k.Buckets() {
		if master(b.Meta) != master(k.Meta) {
			other = b
		}
	}
	if other == nil {
		t.Fatal("every bucket is on the meta's master")
	}
	for round, lost := range []*lua.Keys{k, other} {
		written, _ := buy(t, e, k, "w"+string(rune('a'+round)), 2, "")
		e.process(sale.ID, []flashgate.Order{written})
		reserved := idem("r"+string(rune('a'+round)), "key", 1)
		if reserved.Outcome != lua.Admitted {
			t.Fatalf("round %d: %+v", round, reserved)
		}
		// The keyed order is published: in flight, in the stream.
		publishTo(t, r.js, e, flashgate.Order{ID: reserved.OrderID, SaleID: sale.ID, UserID: "r" + string(rune('a'+round)),
			Quantity: 1, IdemKey: "key", CreatedAt: reserved.At, ExpiresAt: reserved.At.Add(15 * time.Minute)})
		flying, _ := buy(t, e, k, "f"+string(rune('a'+round)), 3, "")
		publishTo(t, r.js, e, flying)
		// The stream holds both; Redis loses one master's part.
		loseRedis(t, e.rc, sale, lost)
		rep := reconcileNow(t, r, sale.ID, ReconcileOptions{})
		if !rep.Rewarmed || !rep.Invariant3Holds {
			t.Fatalf("round %d: reconcile %+v", round, rep)
		}
		again := idem("r"+string(rune('a'+round)), "key", 1)
		if again.Outcome != lua.Replayed || again.OrderID != reserved.OrderID {
			t.Fatalf("round %d: retry of the key: %+v, want a replay of %d", round, again, reserved.OrderID)
		}
		resv, err := lua.Reservations(ctx(t), e.rc, k)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := resv[flying.ID]; !ok || len(resv) < 2 {
			t.Fatalf("round %d: reservations %v lack the order in flight %d", round, resv, flying.ID)
		}
		if u := userUnits(t, e, k.Home("f"+string(rune('a'+round))), "f"+string(rune('a'+round))); u != 3 {
			t.Fatalf("round %d: the flying buyer holds %d, want 3", round, u)
		}
		// Drain: the stream's order and the reserved one are written.
		var pending []flashgate.Order
		for _, o := range resv {
			pending = append(pending, o)
		}
		e.process(sale.ID, pending)
		if rep := reconcileNow(t, r, sale.ID, ReconcileOptions{}); !rep.Invariant3Holds {
			t.Fatalf("round %d: after the drain %+v", round, rep)
		}
	}
}
