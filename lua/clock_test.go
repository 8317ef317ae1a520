package lua_test

import (
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate/lua"
)

// TestHoldAgedByRedisClock: a hold's age is judged on Redis's clock, the one
// hold.lua stamps it with: a gateway whose clock is 5 minutes slow does not
// make its hold look older than lua.HoldGrace, so reconcile (FinishHolds)
// leaves it to the admission that follows; by Redis's clock HoldGrace later,
// it is decided.
func TestHoldAgedByRedisClock(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := phoneSale(t, c, 100, 1, 5)
		const phone = "+4400021"
		us := awayFrom(lua.LimitBucket(phone, heldK), 1, 21)
		a := s.heldArgs(us[0], phone)
		a.Now = a.Now.Add(-5 * time.Minute) // the gateway's clock, 5 minutes slow
		if out, err := scripts.HoldOnly(ctx(t), c, s.k, a); err != nil || out != 0 {
			t.Fatalf("hold: %v %v", out, err)
		}
		if rep := s.finishHolds(time.Now()); rep != (lua.HoldsReport{}) {
			t.Fatalf("a hold just taken by a slow gateway was decided: %+v", rep)
		}
		if adm, err := scripts.HomeAdmitOnly(ctx(t), c, s.k, a); err != nil || adm.Outcome != lua.Admitted {
			t.Fatalf("its admission: %+v %v, want admitted", adm, err)
		}
		if rep := s.finishHolds(time.Now().Add(lua.HoldGrace + time.Second)); rep.Kept != 1 {
			t.Fatalf("finish past the grace: %+v, want the hold kept", rep)
		}
		if n := s.phoneCount(phone); n != 1 {
			t.Fatalf("phone counted %d, want 1", n)
		}
	})
}

// TestReservationAgedByRedisClock: admit.lua stamps a reservation with
// Redis's TIME, whatever the caller's clock says, and lua.Older ages it on
// that clock: a reservation made by a caller 5 minutes slow (or 5 s fast) is
// not older than 30 s, and is older than 0.
func TestReservationAgedByRedisClock(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, nil)
		for _, skew := range []time.Duration{-5 * time.Minute, 5 * time.Second} {
			res, _ := s.admit(lua.AdmitArgs{User: "u" + skew.String(), Now: time.Now().Add(skew)})
			if res.Outcome != lua.Admitted {
				t.Fatalf("admit: %+v", res)
			}
		}
		resv, err := lua.Reservations(ctx(t), c, s.k)
		if err != nil || len(resv) != 2 {
			t.Fatalf("reservations %v %v", resv, err)
		}
		if old, err := lua.Older(ctx(t), c, s.k, resv, 30*time.Second); err != nil || len(old) != 0 {
			t.Fatalf("older than 30 s: %v %v, want none", old, err)
		}
		if old, err := lua.Older(ctx(t), c, s.k, resv, 0); err != nil || len(old) != 2 {
			t.Fatalf("older than 0: %v %v, want both", old, err)
		}
	})
}
