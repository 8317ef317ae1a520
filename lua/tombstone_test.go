package lua_test

import (
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/lua"
)

// TestReleaseBeforeDelayedAdmission: a gateway's admission timed out, so it
// answered 503 and released the order, and the release ran before the
// admission itself (delayed behind a stall on another of rueidis's
// connections). The release of an order Redis does not know leaves a
// tombstone; the late admission meets it and answers duplicate_id, reserving
// nothing: no reservation, no stock or buyer count, no idempotency key, and
// claim (the backend) and restock read the tombstone as released. Invariant
// 6: the 503 stays a refusal, by a fence, not a timing.
func TestReleaseBeforeDelayedAdmission(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, func(s *flashgate.Sale) { s.Regions = map[string]int64{"bj": 6, "sh": 4} })
		id := nextID()
		if r := s.release(id, "bj", lua.ReleaseGateway, flashgate.ReasonAdmitFailed); !r.Unknown || r.Released {
			t.Fatalf("release before the admission = %+v, want unknown", r)
		}
		res, a := s.admit(lua.AdmitArgs{User: "late", OrderID: id, Region: "bj", IdemKey: "K-late"})
		if res.Outcome != lua.DuplicateID {
			t.Fatalf("the delayed admission = %+v, want duplicate_id", res)
		}
		if n := s.remaining("bj"); n != 6 {
			t.Errorf("bj stock %d after the late admission, want 6", n)
		}
		if n := s.held("late"); n != 0 {
			t.Errorf("the buyer holds %d, want 0", n)
		}
		if r := s.resv(); len(r) != 0 {
			t.Errorf("reservations %v, want none", r)
		}
		if known, err := lua.IdemKnown(ctx(t), c, s.k, a.User, a.IdemKey); err != nil || known {
			t.Errorf("idempotency key known %v %v, want free", known, err)
		}
		rec, ok := s.order(id)
		if !ok || rec.Status != lua.StatusReleased || rec.Quantity != 0 || rec.UserID != "" {
			t.Fatalf("record %+v %v, want the tombstone (released, no user, quantity 0)", rec, ok)
		}
		// Everything that reads records takes it for an order that never was.
		if st := s.claim(id); st[0] != lua.ClaimReleased {
			t.Errorf("claim of the tombstone = %v, want released", st)
		}
		if r := s.release(id, "bj", lua.ReleaseGateway, flashgate.ReasonAdmitFailed); r.Outcome != lua.ReleaseAlready || r.Released {
			t.Errorf("release again = %+v, want already", r)
		}
		if n := s.remaining("bj"); n != 6 || len(s.resv()) != 0 {
			t.Errorf("end state: bj stock %d, %d reservations; want 6, none", n, len(s.resv()))
		}
		// A backend-mode release of an unknown order writes nothing (the
		// backend writes the failed record itself).
		other := nextID()
		if r := s.release(other, "bj", lua.ReleaseBackend, flashgate.ReasonSoldOut); !r.Unknown {
			t.Fatalf("backend release of an unknown order = %+v", r)
		}
		if _, ok := s.order(other); ok {
			t.Error("a backend-mode release of an unknown order wrote a record")
		}
	})
}

// TestReleaseBeforeDelayedHeldAdmission: the same on a split sale with a
// limit by phone counted in another bucket (docs/buckets.md): the hold was
// taken, the home's admission timed out, the gateway released the order
// (unknown: a tombstone) and the admission ran after. It answers
// duplicate_id; reconcile (FinishHolds) reads the release's tombstone as "no
// order, ever" and gives the hold back, once, even when the hold itself
// lands after the release.
func TestReleaseBeforeDelayedHeldAdmission(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := phoneSale(t, c, 100, 1, 5)
		const phone = "+4400007"
		us := awayFrom(lua.LimitBucket(phone, heldK), 1, 7)
		a := s.heldArgs(us[0], phone)
		home := s.k.Home(a.User)
		if r, err := scripts.Release(ctx(t), c, home, a.OrderID, "", a.EncodedCharges, lua.ReleaseGateway, flashgate.ReasonAdmitFailed); err != nil || !r.Unknown {
			t.Fatalf("release before the admission: %+v %v, want unknown", r, err)
		}
		// The hold and the admission, both late.
		if out, err := scripts.HoldOnly(ctx(t), c, s.k, a); err != nil || out != 0 {
			t.Fatalf("hold: %v %v", out, err)
		}
		if adm, err := scripts.HomeAdmitOnly(ctx(t), c, s.k, a); err != nil || adm.Outcome != lua.DuplicateID {
			t.Fatalf("the delayed admission: %+v %v, want duplicate_id", adm, err)
		}
		if rep := s.finishHolds(time.Now().Add(lua.HoldGrace + time.Second)); rep.Aborted != 1 || rep.Kept != 0 {
			t.Fatalf("finish: %+v, want the hold given back", rep)
		}
		if n := s.phoneCount(phone); n != 0 || s.remaining("") != 100 || len(s.resv()) != 0 || s.held(a.User) != 0 {
			t.Fatalf("end state: phone counted %d, remaining %d, %d reservations, buyer holds %d; want 0, 100, 0, 0",
				n, s.remaining(""), len(s.resv()), s.held(a.User))
		}
	})
}
