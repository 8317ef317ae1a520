package backend

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// admitIdem admits like admit, with an Idempotency-Key.
func admitIdem(t testing.TB, rc rueidis.Client, k *lua.Keys, user, idem string) flashgate.Order {
	t.Helper()
	now := time.Now()
	a := lua.AdmitArgs{User: user, Quantity: 1, OrderID: nextID.Add(1), Now: now, IdemKey: idem, PayBy: now.Add(15 * time.Minute)}
	got, err := lua.Load().Admit(ctx(t), rc, k, a)
	if err != nil || got.Outcome != lua.Admitted {
		t.Fatalf("admit %s/%s: %v %v", user, idem, got.Outcome, err)
	}
	return flashgate.Order{ID: got.OrderID, SaleID: k.Sale, UserID: user, Quantity: 1, CreatedAt: ms(now.UnixMilli()),
		ExpiresAt: ms(a.PayBy.UnixMilli()), IdemKey: idem}
}

// forgetIdem drops Redis's memory of user's Idempotency-Key idem, as a Redis
// that lost its data (and was warmed from a MySQL not yet holding the order)
// would have none.
func forgetIdem(t testing.TB, rc rueidis.Client, k *lua.Keys, user, idem string) {
	t.Helper()
	if err := rc.Do(ctx(t), rc.B().Hdel().Key(k.Idem).Field(user+"|"+idem).Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

// TestDuplicateIdempotencyKey: two orders of one (sale, user, Idempotency-Key)
// reach MySQL — in separate batches, or in one — after Redis forgot the key's
// first order. The first stays the only live order; the second is a failed row
// with its units given back, and Redis's key points at the first again.
func TestDuplicateIdempotencyKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.RedisAddrs())
	s := spec(10, 3, nil)
	k := e.createSale(s)

	first := admitIdem(t, e.rc, k, "u1", "k1")
	if o := e.process(s.ID, []flashgate.Order{first}); o[0].Status != flashgate.OrderConfirmed {
		t.Fatalf("first: %+v", o[0])
	}
	forgetIdem(t, e.rc, k, "u1", "k1")
	second := admitIdem(t, e.rc, k, "u1", "k1")
	if second.ID == first.ID {
		t.Fatal("the admission replayed: Redis did not forget")
	}
	o := e.process(s.ID, []flashgate.Order{second})
	if o[0].Status != flashgate.OrderFailed || o[0].Reason != flashgate.ReasonDuplicate {
		t.Errorf("second across batches: %+v, want failed %s", o[0], flashgate.ReasonDuplicate)
	}

	// Both in one batch, the newer first: the older holds the key.
	a := admitIdem(t, e.rc, k, "u2", "k2")
	forgetIdem(t, e.rc, k, "u2", "k2")
	b := admitIdem(t, e.rc, k, "u2", "k2")
	out := e.process(s.ID, []flashgate.Order{b, a})
	if out[1].Status != flashgate.OrderConfirmed || out[0].Status != flashgate.OrderFailed || out[0].Reason != flashgate.ReasonDuplicate {
		t.Errorf("one batch: newer %+v, older %+v; want the older confirmed, the newer a duplicate", out[0], out[1])
	}

	if got := e.sold(s.ID); got != 2 {
		t.Errorf("sold = %d, want 2 (one unit per key)", got)
	}
	for user, want := range map[string]int64{"u1": 1, "u2": 1} {
		if got := e.units(s.ID, user); got != want {
			t.Errorf("user_purchases %s = %d, want %d", user, got, want)
		}
	}
	if got := e.rows(s.ID, "confirmed"); got != 2 {
		t.Errorf("confirmed rows = %d, want 2", got)
	}
	if got := e.rows(s.ID, "failed"); got != 2 {
		t.Errorf("failed rows = %d, want 2", got)
	}
	if got := remaining(t, e.rc, k, ""); got != 8 {
		t.Errorf("redis stock = %d, want 8: the duplicates' units did not come back", got)
	}
	for field, want := range map[string]uint64{"u1|k1": first.ID, "u2|k2": a.ID} {
		v, err := e.rc.Do(ctx(t), e.rc.B().Hget().Key(k.Idem).Field(field).Build()).ToString()
		if err != nil || v != strconv.FormatUint(want, 10) {
			t.Errorf("redis idem %s = %q (%v), want %d", field, v, err, want)
		}
	}
	if r := check(t, e, s.ID, []uint64{first.ID, second.ID, a.ID, b.ID}); !r.OK() {
		t.Errorf("audit: %v", r)
	}
}

// TestRewarmRestoresOrdersAndKeys: Redis loses its data with one order in
// MySQL and one still in the stream, both with Idempotency-Keys. The warm
// writes both back before the sale answers again: a retry of either key
// replays its order instead of buying again, and each order's record is there
// for GET (the written one with MySQL's status, the one in flight pending).
func TestRewarmRestoresOrdersAndKeys(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	e := newEnv(t, []string{srv.Addr})
	r := idleBackend(t, e)
	s := spec(10, 2, nil)
	k := e.createSale(s)

	written := admitIdem(t, e.rc, k, "u1", "k1")
	e.process(s.ID, []flashgate.Order{written})
	inFlight := admitIdem(t, e.rc, k, "u2", "k2")
	publishTo(t, r.js, e, inFlight)

	srv.Kill()
	srv.Start() // empty: no persistence
	eventually(t, 10*time.Second, "a reconcile on the restarted Redis", func() bool {
		_, err := r.Reconcile(ctx(t), s.ID)
		return err == nil
	})

	for _, c := range []struct {
		m      flashgate.Order
		status flashgate.OrderStatus
	}{{written, "confirmed"}, {inFlight, "processing"}} {
		rec, ok, err := lua.Order(ctx(t), e.rc, k, c.m.ID)
		if err != nil || !ok || rec.Status != c.status || rec.UserID != c.m.UserID || rec.IdemKey != c.m.IdemKey {
			t.Errorf("order %d after the loss: %+v ok=%v err=%v, want %s of %s", c.m.ID, rec, ok, err, c.status, c.m.UserID)
		}
		now := time.Now()
		got, err := lua.Load().Admit(ctx(t), e.rc, k, lua.AdmitArgs{User: c.m.UserID, Quantity: 1, OrderID: nextID.Add(1),
			Now: now, IdemKey: c.m.IdemKey, PayBy: now.Add(time.Minute)})
		if err != nil || got.Outcome != lua.Replayed || got.OrderID != c.m.ID {
			t.Errorf("retry of %s/%s: %v %d (err %v), want a replay of %d", c.m.UserID, c.m.IdemKey, got.Outcome, got.OrderID, err, c.m.ID)
		}
	}

	// The order in flight lands; its status is written back over the record.
	b, err := dialAndStart(t, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Shutdown(context.Background()) })
	eventually(t, 15*time.Second, "the order in flight written back", func() bool {
		st, _ := redisStatus(t, e.rc, k, inFlight.ID)
		return st == "confirmed"
	})
	if r := check(t, e, s.ID, []uint64{written.ID, inFlight.ID}); !r.OK() || r.Sold != 2 || r.RedisReserved != 0 {
		t.Errorf("audit: %v", r)
	}
}

// TestDeadLetterOfDuplicateKey: an order dead-lettered while another order
// holds its Idempotency-Key still gets its failed row (without the key).
func TestDeadLetterOfDuplicateKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.RedisAddrs())
	s := spec(10, 3, nil)
	k := e.createSale(s)
	first := admitIdem(t, e.rc, k, "u1", "k1")
	e.process(s.ID, []flashgate.Order{first})
	dup := first
	dup.ID = nextID.Add(1)
	st, wrote, err := failOrderRow(ctx(t), e.db, dup, flashgate.ReasonDeadLetter, time.Now())
	if err != nil || !wrote || st.status != flashgate.OrderFailed {
		t.Fatalf("dead-lettered duplicate: %+v wrote=%v err=%v", st, wrote, err)
	}
	if n := e.queryInt(`SELECT COUNT(*) FROM orders WHERE id = ? AND idem_key IS NULL AND status = 'failed'`, dup.ID); n != 1 {
		t.Errorf("%d failed rows without the key for the duplicate, want 1", n)
	}
}
