package lua_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/lua"
)

// dropRestocked removes the sale's restocked set when the test ends.
func (s *sale) dropRestocked() {
	s.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.c.Do(ctx, s.c.B().Del().Key(s.k.Restocked()).Build()).Error()
	})
}

func (s *sale) restock(id uint64, a lua.AdmitArgs, reason string) lua.RestockOutcome {
	s.t.Helper()
	r, err := scripts.Restock(ctx(s.t), s.c, s.k, restocking(id, flashgate.OrderCanceled, reason, record("", a)))
	if err != nil {
		s.t.Fatalf("restock %d: %v", id, err)
	}
	return r.Outcome
}

func (s *sale) confirm(id uint64, st flashgate.OrderStatus, rec flashgate.Order) {
	s.t.Helper()
	if _, err := scripts.Confirm(ctx(s.t), s.c, s.k, []flashgate.Order{settled(id, st, rec)}); err != nil {
		s.t.Fatal(err)
	}
}

func TestRestockConfirmed(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, nil)
		s.dropRestocked()
		id, a := s.mustAdmit(lua.AdmitArgs{User: "u1", Quantity: 2, IdemKey: "k1"})
		other, _ := s.mustAdmit(lua.AdmitArgs{User: "u2"})
		s.claim(id)
		s.confirm(id, flashgate.OrderConfirmed, record("", a))
		if s.remaining("") != 7 || s.held("u1") != 2 {
			t.Fatalf("before: remaining %d, held %d", s.remaining(""), s.held("u1"))
		}
		for i, want := range []lua.RestockOutcome{lua.Restocked, lua.RestockAlready, lua.RestockAlready} {
			if got := s.restock(id, a, "expired"); got != want {
				t.Fatalf("restock #%d = %v, want %v", i, got, want)
			}
			if s.remaining("") != 9 || s.held("u1") != 0 || s.held("u2") != 1 {
				t.Fatalf("after restock #%d: remaining %d, held u1 %d u2 %d", i, s.remaining(""), s.held("u1"), s.held("u2"))
			}
			want := record("canceled", a)
			want.Reason = "expired"
			if got, _ := s.order(id); got != want {
				t.Fatalf("record = %+v, want %+v", got, want)
			}
		}
		if _, ok := s.resv()[other]; !ok || len(s.resv()) != 1 {
			t.Fatalf("reservations = %v, want only the other order's", s.resv())
		}
		// The buyer may buy again, up to the limit.
		s.mustAdmit(lua.AdmitArgs{User: "u1", Quantity: 2})
		// The idempotency key still names the canceled order.
		if res, _ := s.admit(lua.AdmitArgs{User: "u1", IdemKey: "k1"}); res.Outcome != lua.Replayed || res.OrderID != id {
			t.Fatalf("replay = %+v", res)
		}
	})
}

// An order MySQL confirmed and canceled before Redis heard of the confirmation:
// it still holds its reservation, which ends with the restock.
func TestRestockReserved(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, nil)
		s.dropRestocked()
		id, a := s.mustAdmit(lua.AdmitArgs{User: "u1"})
		s.claim(id)
		if got := s.restock(id, a, "canceled"); got != lua.Restocked {
			t.Fatalf("restock = %v", got)
		}
		// A buyer's cancel: the unit is back on sale, the buyer's quota stays taken.
		if len(s.resv()) != 0 || s.remaining("") != 10 || s.held("u1") != 1 {
			t.Fatalf("resv %v, remaining %d, held %d (want 1: a cancel keeps the quota)", s.resv(), s.remaining(""), s.held("u1"))
		}
		// The batch's late confirm rewrites the record as confirmed: another
		// restock (a retried cancel, reconcile) must not count the unit again,
		// and puts the status right.
		s.confirm(id, flashgate.OrderConfirmed, record("", a))
		if got := s.restock(id, a, "canceled"); got != lua.RestockAlready {
			t.Fatalf("restock after a stale confirm = %v", got)
		}
		if s.remaining("") != 10 {
			t.Fatalf("remaining = %d: counted twice", s.remaining(""))
		}
		if rec, _ := s.order(id); rec.Status != "canceled" {
			t.Fatalf("status = %q", rec.Status)
		}
	})
}

// A redelivery wrote MySQL's 'canceled' into the record before the restock ran:
// the units have not gone back yet, and do now.
func TestRestockAfterCanceledRecord(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, nil)
		s.dropRestocked()
		id, a := s.mustAdmit(lua.AdmitArgs{User: "u1", Quantity: 2})
		rec := record("", a)
		rec.Reason = "canceled"
		s.confirm(id, flashgate.OrderCanceled, rec)
		if s.remaining("") != 8 {
			t.Fatal("confirm moved stock")
		}
		if got := s.restock(id, a, "canceled"); got != lua.Restocked {
			t.Fatalf("restock = %v", got)
		}
		if s.remaining("") != 10 || s.held("u1") != 2 {
			t.Fatalf("remaining %d, held %d (want 2: a cancel keeps the quota)", s.remaining(""), s.held("u1"))
		}
	})
}

func TestRestockOddCases(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, nil)
		s.dropRestocked()
		// Redis lost the order: the record comes back, the counters stay.
		lost := lua.AdmitArgs{User: "u9", Quantity: 2, Now: time.UnixMilli(1000), PayBy: time.UnixMilli(2000)}
		id := nextID()
		for i, want := range []lua.RestockOutcome{lua.RestockUnknown, lua.RestockAlready} {
			if got := s.restock(id, lost, "canceled"); got != want {
				t.Fatalf("restock #%d of a lost order = %v, want %v", i, got, want)
			}
		}
		want := record("canceled", lost)
		want.Reason = "canceled"
		if got, ok := s.order(id); !ok || got != want {
			t.Fatalf("rewritten = %+v, %v; want %+v", got, ok, want)
		}
		if s.remaining("") != 10 || s.held("u9") != 0 {
			t.Fatalf("a lost order moved counters: remaining %d, held %d", s.remaining(""), s.held("u9"))
		}

		// A failed order gave its units back through release already.
		failed, fa := s.mustAdmit(lua.AdmitArgs{User: "u1"})
		s.release(failed, "", lua.ReleaseBackend, flashgate.ReasonSoldOut)
		if got := s.restock(failed, fa, "canceled"); got != lua.RestockAlready {
			t.Fatalf("restock of a released order = %v", got)
		}
		if s.remaining("") != 10 || s.held("u1") != 0 {
			t.Fatalf("remaining %d, held %d", s.remaining(""), s.held("u1"))
		}

		// A region Keys do not have is refused before the script runs.
		stray, sa := s.mustAdmit(lua.AdmitArgs{User: "u2"})
		sa.Region = "xx"
		xx := record("", sa)
		xx.Region = "xx"
		if _, err := scripts.Restock(ctx(t), c, s.k, restocking(stray, "canceled", "canceled", xx)); err == nil {
			t.Fatal("a region Keys do not have was accepted")
		}

		// MySQL and Redis disagree about an order's region: an error, and nothing
		// of the batch is written.
		r := newSale(t, c, func(sp *flashgate.Sale) { sp.Regions = map[string]int64{"bj": 5, "sh": 5} })
		r.dropRestocked()
		good, ga := r.mustAdmit(lua.AdmitArgs{User: "u2", Region: "bj"})
		bad, ba := r.mustAdmit(lua.AdmitArgs{User: "u3", Region: "bj"})
		wrong := record("", ba)
		wrong.Region = "sh"
		_, err := scripts.RestockMany(ctx(t), c, r.k, []flashgate.Order{
			restocking(good, flashgate.OrderCanceled, "canceled", record("", ga)),
			restocking(bad, flashgate.OrderCanceled, "canceled", wrong),
		})
		if err == nil || !strings.Contains(err.Error(), "region") {
			t.Fatalf("region mismatch: %v", err)
		}
		if rec, _ := r.order(good); rec.Status != "pending" || r.remaining("bj") != 3 || r.held("u2") != 1 {
			t.Fatalf("a refused restock wrote: %+v, bj %d", rec, r.remaining("bj"))
		}
		if out, err := scripts.RestockMany(ctx(t), c, s.k, nil); err != nil || out != nil {
			t.Fatalf("restock of nothing = %v, %v", out, err)
		}
	})
}

func TestRestockManyRegions(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, func(sp *flashgate.Sale) {
			sp.Total, sp.PerUserLimit, sp.Regions = 10, 3, map[string]int64{"bj": 4, "sh": 6}
		})
		s.dropRestocked()
		var batch []flashgate.Order
		for _, a := range []lua.AdmitArgs{
			{User: "u1", Quantity: 2, Region: "bj"},
			{User: "u1", Region: "sh"},
			{User: "u2", Quantity: 2, Region: "sh"},
		} {
			id, a := s.mustAdmit(a)
			s.confirm(id, flashgate.OrderConfirmed, record("", a))
			batch = append(batch, restocking(id, flashgate.OrderCanceled, "expired", record("", a)))
		}
		keep, _ := s.mustAdmit(lua.AdmitArgs{User: "u2", Region: "bj"})
		if s.remaining("bj") != 1 || s.remaining("sh") != 3 {
			t.Fatalf("before: bj %d sh %d", s.remaining("bj"), s.remaining("sh"))
		}
		out, err := scripts.RestockMany(ctx(t), c, s.k, batch)
		if err != nil {
			t.Fatal(err)
		}
		for i, o := range out {
			if o != lua.Restocked {
				t.Fatalf("outcome %d = %v", i, o)
			}
		}
		if s.remaining("bj") != 3 || s.remaining("sh") != 6 || s.held("u1") != 0 || s.held("u2") != 1 {
			t.Fatalf("after: bj %d sh %d, held u1 %d u2 %d", s.remaining("bj"), s.remaining("sh"), s.held("u1"), s.held("u2"))
		}
		if _, ok := s.resv()[keep]; !ok {
			t.Fatal("an unrelated reservation ended")
		}
		// The same batch again, with a new order in it: only the new one counts.
		nid, na := s.mustAdmit(lua.AdmitArgs{User: "u3", Region: "sh"})
		s.confirm(nid, flashgate.OrderConfirmed, record("", na))
		batch = append(batch, restocking(nid, flashgate.OrderCanceled, "expired", record("", na)))
		out, err = scripts.RestockMany(ctx(t), c, s.k, batch)
		if err != nil {
			t.Fatal(err)
		}
		if out[0] != lua.RestockAlready || out[3] != lua.Restocked || s.remaining("sh") != 6 {
			t.Fatalf("second batch = %v, sh %d", out, s.remaining("sh"))
		}
	})
}

func TestMarkPaid(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, nil)
		id, a := s.mustAdmit(lua.AdmitArgs{User: "u1"})
		s.confirm(id, flashgate.OrderConfirmed, record("", a))
		for range 2 {
			if err := scripts.MarkPaid(ctx(t), c, s.k, settled(id, "", record("", a))); err != nil {
				t.Fatal(err)
			}
			if got, _ := s.order(id); got != record("paid", a) {
				t.Fatalf("record = %+v", got)
			}
		}
		if s.remaining("") != 9 || s.held("u1") != 1 {
			t.Fatal("paying moved counters")
		}
	})
}

func TestRestockOutcomeString(t *testing.T) {
	for o, want := range map[lua.RestockOutcome]string{lua.Restocked: "restocked", lua.RestockAlready: "already",
		lua.RestockUnknown: "unknown", 9: "restock(9)"} {
		if o.String() != want {
			t.Errorf("%d = %q, want %q", o, o.String(), want)
		}
	}
}
