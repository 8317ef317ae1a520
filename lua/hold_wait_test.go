package lua_test

import (
	"errors"
	"testing"
	"time"

	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// TestHoldWait: under redis.wait_replicas a purchase limit counted in another
// bucket than the buyer's home (hold.lua, docs/buckets.md) is held with a
// WAIT like the admission: on the stack's Cluster (one replica behind every
// master), a hold that asks for 2 replicas is not confirmed, so it is given
// back and the purchase stops there with ErrNotReplicated, before its
// admission runs: no reservation, no record, no count. Asking for 1, the
// same purchase is admitted and the phone counted once.
func TestHoldWait(t *testing.T) {
	c := testenv.Redis(t, testenv.ClusterAddrs())
	s := phoneSale(t, c, 100, 1, 5)
	const phone = "+4400011"
	us := awayFrom(lua.LimitBucket(phone, heldK), 1, 11)
	a := s.heldArgs(us[0], phone)
	adm, err := scripts.AdmitHeld(ctx(t), c, s.k, a, 2, 20*time.Millisecond)
	if !errors.Is(err, lua.ErrNotReplicated) {
		t.Fatalf("admission whose hold is not replicated: %+v %v, want ErrNotReplicated", adm, err)
	}
	if n := s.phoneCount(phone); n != 0 {
		t.Errorf("phone counted %d after the unconfirmed hold, want 0 (given back)", n)
	}
	if r := s.resv(); len(r) != 0 {
		t.Errorf("reservations %v: the admission ran after an unconfirmed hold", r)
	}
	if _, ok, err := lua.Order(ctx(t), c, s.k.Home(a.User), a.OrderID); err != nil || ok {
		t.Errorf("the order has a record (%v %v): the admission ran after an unconfirmed hold", ok, err)
	}
	b := s.heldArgs(us[0], phone)
	if adm, err := scripts.AdmitHeld(ctx(t), c, s.k, b, 1, time.Second); err != nil || adm.Outcome != lua.Admitted {
		t.Fatalf("admission waiting for 1 replica: %+v %v, want admitted", adm, err)
	}
	if n := s.phoneCount(phone); n != 1 {
		t.Errorf("phone counted %d, want 1", n)
	}
}
