package lua_test

import (
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/lua"
)

// Purchase limits by phone (any dimension but the user) on a sale with
// buckets (docs/buckets.md): the phone's counter lives in one bucket,
// lua.LimitBucket(phone), whatever the buyers' homes.

const heldK = 4

// phoneSale warms a sale of total units over heldK buckets with a limit of
// max units per phone (limit 0) and per_user_limit perUser.
func phoneSale(t *testing.T, c rueidis.Client, total, max, perUser int64) *sale {
	t.Helper()
	return newBucketed(t, c, heldK, total, func(sp *flashgate.Sale) {
		sp.PerUserLimit, sp.PerOrderMax = perUser, 1
		sp.Limits = []flashgate.Limit{{Dimension: flashgate.DimPhone, Max: max}}
	})
}

// awayFrom finds n users whose homes differ from each other and from bucket b
// (n < heldK).
func awayFrom(b, n, salt int) []string {
	var out []string
	for h := 0; h < heldK && len(out) < n; h++ {
		if h != b {
			out = append(out, userIn(h, heldK, salt))
		}
	}
	return out
}

// buyHeld admits one unit by user with phone the way the gateway does.
func (s *sale) buyHeld(user, phone string) (lua.Admission, lua.AdmitArgs) {
	s.t.Helper()
	a := s.heldArgs(user, phone)
	adm, err := scripts.AdmitHeld(ctx(s.t), s.c, s.k, a, 0, 0)
	if err != nil {
		s.t.Fatalf("admit %s: %v", user, err)
	}
	return adm, a
}

func (s *sale) heldArgs(user, phone string) lua.AdmitArgs {
	s.t.Helper()
	now := time.Now()
	cs, err := s.spec.Charges(flashgate.Subjects{User: user, Phone: phone}, 1, now, time.UTC)
	if err != nil {
		s.t.Fatal(err)
	}
	return lua.AdmitArgs{User: user, Quantity: 1, OrderID: nextID(), Now: now, PayBy: now.Add(time.Minute),
		Charges: cs, Limits: s.spec.Limits, EncodedCharges: flashgate.EncodeCharges(cs)}
}

// phoneCount is phone's counter of limit 0, read in every bucket: the
// phone's own, and any other (which must have none).
func (s *sale) phoneCount(phone string) int64 {
	s.t.Helper()
	var n int64
	for i, b := range s.k.Buckets() {
		v, err := s.c.Do(ctx(s.t), s.c.B().Hget().Key(b.Limit("sale")).Field("0/"+phone).Build()).AsInt64()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			s.t.Fatal(err)
		}
		if i != lua.LimitBucket(phone, heldK) {
			s.t.Fatalf("phone %s counted %d in bucket %d, its bucket is %d", phone, v, i, lua.LimitBucket(phone, heldK))
		}
		n += v
	}
	return n
}

// bucketSnapshot is every key of every bucket an admission could touch.
func (s *sale) bucketSnapshot() map[string]string {
	s.t.Helper()
	var keys []string
	for _, b := range s.k.Buckets() {
		_, stock := b.StockKeys()
		keys = append(keys, b.Meta, b.Users, b.Resv, b.Orders, b.Idem, b.Limit("sale"))
		keys = append(append(keys, stock...), b.HoldKeys()...)
	}
	return s.keysState(keys)
}

func (s *sale) finishHolds(at time.Time) lua.HoldsReport {
	s.t.Helper()
	rep, err := lua.FinishHoldsAt(ctx(s.t), s.c, s.k, at)
	if err != nil {
		s.t.Fatal(err)
	}
	return rep
}

// TestHeldPhoneAcrossBuckets: two buyers in different home buckets, neither
// the phone's, share a phone with a limit of 1: the first is admitted, the
// second refused by the phone's limit, and the count is in the phone's bucket
// only. A buyer at home in the phone's bucket is checked there in one call.
func TestHeldPhoneAcrossBuckets(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := phoneSale(t, c, 100, 1, 5)
		const phone = "+8613800000001"
		pb := lua.LimitBucket(phone, heldK)
		us := awayFrom(pb, 2, 1)
		if adm, _ := s.buyHeld(us[0], phone); adm.Outcome != lua.Admitted {
			t.Fatalf("%s: %+v, want admitted", us[0], adm)
		}
		if adm, _ := s.buyHeld(us[1], phone); adm.Outcome != lua.LimitReached || adm.Limit != 0 || adm.Held != 1 {
			t.Fatalf("%s, same phone, another home: %+v, want limit_reached by limit 0 holding 1", us[1], adm)
		}
		local := userIn(pb, heldK, 1)
		if adm, _ := s.buyHeld(local, phone); adm.Outcome != lua.LimitReached || adm.Limit != 0 {
			t.Fatalf("%s, at home in the phone's bucket: %+v, want limit_reached by limit 0", local, adm)
		}
		if n := s.phoneCount(phone); n != 1 {
			t.Fatalf("phone counted %d, want 1", n)
		}
		// A charge at 0 is for a counter of another bucket only: admit.lua
		// refuses one whose counter is its own (FNV-1a in Lua, as in Go).
		a := s.heldArgs(local, "+8613800000002")
		for lua.LimitBucket(a.Charges[0].Subject, heldK) != pb {
			a = s.heldArgs(local, a.Charges[0].Subject+"1")
		}
		a.Charges[0].Inc = 0
		if adm, err := scripts.Admit(ctx(t), c, s.k.Home(local), a); err == nil {
			t.Fatalf("a charge at 0 whose counter is at home: %+v, want an error", adm)
		}
		// The order is kept: reconcile, long after, finds nothing to decide.
		if rep := s.finishHolds(time.Now().Add(time.Hour)); rep != (lua.HoldsReport{}) {
			t.Fatalf("finish holds after clean admissions: %+v", rep)
		}
		if got := s.remaining(""); got != 99 {
			t.Fatalf("remaining %d, want 99", got)
		}
	})
}

// TestHeldPhoneRace: 40 buyers spread over every home bucket race for one
// phone limited to 3 units: exactly 3 are admitted, the counter says 3, the
// stock went down by 3, and no hold is left undecided.
func TestHeldPhoneRace(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		for round := range 3 {
			s := phoneSale(t, c, 1000, 3, 5)
			phone := "+86139" + strconv.Itoa(10000+round)
			var admitted, limited atomic.Int64
			var wg sync.WaitGroup
			for i := range 40 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					adm, err := scripts.AdmitHeld(ctx(t), c, s.k, s.heldArgs(userIn(i%heldK, heldK, 100*round+i), phone), 0, 0)
					switch {
					case err != nil:
						t.Error(err)
					case adm.Outcome == lua.Admitted:
						admitted.Add(1)
					case adm.Outcome == lua.LimitReached && adm.Limit == 0:
						limited.Add(1)
					default:
						t.Errorf("unexpected %+v", adm)
					}
				}()
			}
			wg.Wait()
			if admitted.Load() != 3 || limited.Load() != 37 {
				t.Fatalf("round %d: %d admitted, %d limited; want 3 and 37", round, admitted.Load(), limited.Load())
			}
			if n := s.phoneCount(phone); n != 3 {
				t.Fatalf("round %d: phone counted %d, want 3", round, n)
			}
			if got := s.remaining(""); got != 997 {
				t.Fatalf("round %d: remaining %d, want 997", round, got)
			}
			if rep := s.finishHolds(time.Now().Add(time.Hour)); rep != (lua.HoldsReport{}) {
				t.Fatalf("round %d: holds left: %+v", round, rep)
			}
		}
	})
}

// TestHeldRefusalLeavesRedisAsItWas: the phone's hold is taken, then the
// home refuses (the buyer's per_user_limit; the sale sold out): the hold is
// given back and every bucket is as it was.
func TestHeldRefusalLeavesRedisAsItWas(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		t.Run("per-user limit", func(t *testing.T) {
			s := phoneSale(t, c, 100, 1, 1)
			u := awayFrom(lua.LimitBucket("+100001", heldK), 1, 2)[0]
			if adm, _ := s.buyHeld(u, "+100001"); adm.Outcome != lua.Admitted {
				t.Fatalf("first: %+v", adm)
			}
			// Another phone whose bucket is not u's home either.
			phone := ""
			for i := 0; phone == ""; i++ {
				p := "+2000" + strconv.Itoa(i)
				if lua.LimitBucket(p, heldK) != lua.HomeBucket(u, heldK) {
					phone = p
				}
			}
			before := s.bucketSnapshot()
			if adm, _ := s.buyHeld(u, phone); adm.Outcome != lua.LimitReached || adm.Limit != -1 {
				t.Fatalf("second: %+v, want limit_reached by per_user_limit", adm)
			}
			if after := s.bucketSnapshot(); !reflect.DeepEqual(before, after) {
				t.Fatalf("a refusal at home changed Redis:\nbefore %v\nafter  %v", before, after)
			}
		})
		t.Run("sold out", func(t *testing.T) {
			s := phoneSale(t, c, heldK, 1, 1)
			for i := range heldK {
				if adm, _ := s.buyHeld(userIn(i, heldK, 30), "+39999"+strconv.Itoa(i)); adm.Outcome != lua.Admitted {
					t.Fatalf("buyer %d: %+v", i, adm)
				}
			}
			u := awayFrom(lua.LimitBucket("+300001", heldK), 1, 3)[0]
			before := s.bucketSnapshot()
			if adm, _ := s.buyHeld(u, "+300001"); adm.Outcome != lua.SoldOut {
				t.Fatalf("second: %+v, want sold_out", adm)
			}
			if after := s.bucketSnapshot(); !reflect.DeepEqual(before, after) {
				t.Fatalf("a sold-out changed Redis:\nbefore %v\nafter  %v", before, after)
			}
		})
	})
}

// TestHeldCrashFinished: a gateway dies after the hold. Reconcile leaves a
// young hold alone; past lua.HoldGrace it decides it both ways: no order in
// the home (the count goes back, and the late admission of that id is
// refused), or the order there (the hold is its count, given back once when
// its units come back).
func TestHeldCrashFinished(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := phoneSale(t, c, 100, 1, 5)
		const phone = "+4400001"
		us := awayFrom(lua.LimitBucket(phone, heldK), 3, 4)

		// No admission after the hold.
		a := s.heldArgs(us[0], phone)
		if out, err := scripts.HoldOnly(ctx(t), c, s.k, a); err != nil || out != 0 {
			t.Fatalf("hold: %v %v", out, err)
		}
		if n := s.phoneCount(phone); n != 1 {
			t.Fatalf("held: phone counted %d", n)
		}
		if rep := s.finishHolds(time.Now()); rep != (lua.HoldsReport{}) {
			t.Fatalf("a young hold was decided: %+v", rep)
		}
		if rep := s.finishHolds(time.Now().Add(lua.HoldGrace + time.Second)); rep.Aborted != 1 || rep.Kept != 0 {
			t.Fatalf("finish: %+v, want one hold given back", rep)
		}
		if n := s.phoneCount(phone); n != 0 {
			t.Fatalf("after the give-back: phone counted %d", n)
		}
		if adm, err := scripts.HomeAdmitOnly(ctx(t), c, s.k, a); err != nil || adm.Outcome != lua.DuplicateID {
			t.Fatalf("late admission of the aborted id: %+v %v, want duplicate_id", adm, err)
		}
		if s.phoneCount(phone) != 0 || s.remaining("") != 100 {
			t.Fatalf("the late admission counted something")
		}
		if rep := s.finishHolds(time.Now().Add(time.Hour)); rep != (lua.HoldsReport{}) {
			t.Fatalf("second finish: %+v", rep)
		}

		// The admission ran; nothing kept the hold.
		b := s.heldArgs(us[1], phone)
		if out, err := scripts.HoldOnly(ctx(t), c, s.k, b); err != nil || out != 0 {
			t.Fatalf("hold: %v %v", out, err)
		}
		if adm, err := scripts.HomeAdmitOnly(ctx(t), c, s.k, b); err != nil || adm.Outcome != lua.Admitted {
			t.Fatalf("admission: %+v %v", adm, err)
		}
		if rep := s.finishHolds(time.Now().Add(lua.HoldGrace + time.Second)); rep.Kept != 1 || rep.Aborted != 0 {
			t.Fatalf("finish: %+v, want the hold kept", rep)
		}
		if n := s.phoneCount(phone); n != 1 {
			t.Fatalf("kept: phone counted %d, want 1", n)
		}
		if adm, _ := s.buyHeld(us[2], phone); adm.Outcome != lua.LimitReached {
			t.Fatalf("a third buyer of the phone: %+v, want limit_reached", adm)
		}
		// Its units come back (canceled unpaid): so does the phone's count, once.
		o := flashgate.Order{ID: b.OrderID, SaleID: s.spec.ID, UserID: b.User, Quantity: 1, Status: flashgate.OrderCanceled,
			Reason: flashgate.ReasonExpired, CreatedAt: ms(b.Now.UnixMilli()), ExpiresAt: ms(b.PayBy.UnixMilli()), Charges: b.EncodedCharges}
		for range 2 {
			if _, err := scripts.RestockMany(ctx(t), c, s.k, []flashgate.Order{o}); err != nil {
				t.Fatal(err)
			}
		}
		if n := s.phoneCount(phone); n != 0 {
			t.Fatalf("after the restock: phone counted %d, want 0", n)
		}
		if adm, _ := s.buyHeld(us[2], phone); adm.Outcome != lua.Admitted {
			t.Fatalf("the phone after the restock: %+v, want admitted", adm)
		}
	})
}

// TestHeldGiveBack: expiry (restock) and a failed order (release) give the
// phone's count back in the phone's bucket; a release whose give-back a crash
// cut is finished by reconcile, and a give-back repeated gives nothing twice.
func TestHeldGiveBack(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := phoneSale(t, c, 100, 1, 5)
		const phone = "+5500001"
		us := awayFrom(lua.LimitBucket(phone, heldK), 3, 5)
		order := func(a lua.AdmitArgs, st flashgate.OrderStatus, reason string) flashgate.Order {
			return flashgate.Order{ID: a.OrderID, SaleID: s.spec.ID, UserID: a.User, Quantity: 1, Status: st, Reason: reason,
				CreatedAt: ms(a.Now.UnixMilli()), ExpiresAt: ms(a.PayBy.UnixMilli()), Charges: a.EncodedCharges}
		}

		// Expiry.
		adm, a := s.buyHeld(us[0], phone)
		if adm.Outcome != lua.Admitted {
			t.Fatalf("%+v", adm)
		}
		out, err := scripts.RestockMany(ctx(t), c, s.k, []flashgate.Order{order(a, flashgate.OrderCanceled, flashgate.ReasonExpired)})
		if err != nil || out[0] != lua.Restocked {
			t.Fatalf("restock: %v %v", out, err)
		}
		if n := s.phoneCount(phone); n != 0 {
			t.Fatalf("after expiry: phone counted %d", n)
		}

		// MySQL refused the order (backend release).
		adm, a = s.buyHeld(us[1], phone)
		if adm.Outcome != lua.Admitted {
			t.Fatalf("%+v", adm)
		}
		r, err := scripts.Release(ctx(t), c, s.k.Home(a.User), a.OrderID, "", a.EncodedCharges, lua.ReleaseBackend, "test")
		if err != nil || !r.Released {
			t.Fatalf("release: %+v %v", r, err)
		}
		if n := s.phoneCount(phone); n != 0 {
			t.Fatalf("after release: phone counted %d", n)
		}

		// The releaser dies after release.lua: the count stays until reconcile.
		adm, a = s.buyHeld(us[2], phone)
		if adm.Outcome != lua.Admitted {
			t.Fatalf("%+v", adm)
		}
		if err := scripts.ReleaseScriptOnly(ctx(t), c, s.k.Home(a.User), a.OrderID, a.EncodedCharges); err != nil {
			t.Fatal(err)
		}
		if n := s.phoneCount(phone); n != 1 {
			t.Fatalf("release cut short: phone counted %d, want 1", n)
		}
		if rep := s.finishHolds(time.Now()); rep.GivenBack != 1 {
			t.Fatalf("finish: %+v, want one give-back", rep)
		}
		if n := s.phoneCount(phone); n != 0 {
			t.Fatalf("after reconcile: phone counted %d", n)
		}
		// Another buyer takes the phone's unit; a stale give-back of the
		// released order (a crash after the bucket gave, before the entry
		// went) must not give theirs away.
		if adm, _ := s.buyHeld(us[0], phone); adm.Outcome != lua.Admitted {
			t.Fatalf("%+v", adm)
		}
		if err := scripts.ReleaseScriptOnly(ctx(t), c, s.k.Home(a.User), a.OrderID, a.EncodedCharges); err != nil {
			t.Fatal(err)
		}
		home := s.k.Home(a.User)
		if err := c.Do(ctx(t), c.B().Hset().Key(home.HoldKeys()[2]).FieldValue().FieldValue(strconv.FormatUint(a.OrderID, 10), a.EncodedCharges).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		s.finishHolds(time.Now())
		if n := s.phoneCount(phone); n != 1 {
			t.Fatalf("a repeated give-back: phone counted %d, want 1", n)
		}
	})
}
