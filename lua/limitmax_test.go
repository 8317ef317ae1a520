package lua_test

import (
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/lua"
)

// The admission script checks charges against the maxima of the sale's own
// meta, whatever the caller's copy of the limits says: a caller passing
// max=1e9 is refused at the sale's max all the same, also for a meta warmed
// before the maxima had a field of their own. A caller that leaves a limit's
// charge out or charges 0 is refused with nothing reserved.
func TestAdmitIgnoresCallerMaxima(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		for _, oldMeta := range []bool{false, true} {
			name := "lmax"
			if oldMeta {
				name = "limits json"
			}
			t.Run(name, func(t *testing.T) {
				s := limited(t, c, 100, "", flashgate.Limit{Dimension: flashgate.DimPhone, Max: 2},
					flashgate.Limit{Dimension: flashgate.DimDevice, Max: 1, Of: flashgate.OfOrders})
				if oldMeta {
					if err := c.Do(ctx(t), c.B().Hdel().Key(s.k.Meta).Field("lmax").Build()).Error(); err != nil {
						t.Fatal(err)
					}
				}
				lifted := []flashgate.Limit{
					{Dimension: flashgate.DimPhone, Max: 1e9, Of: flashgate.OfUnits, Per: flashgate.PerSale},
					{Dimension: flashgate.DimDevice, Max: 1e9, Of: flashgate.OfOrders, Per: flashgate.PerSale},
				}
				loc, _ := s.spec.Location()
				buy := func(user, device string) (lua.Admission, error) {
					sub := flashgate.Subjects{User: user, Phone: "+8613800000001", Device: device}
					cs, err := s.spec.Charges(sub, 1, time.Now(), loc)
					if err != nil {
						t.Fatal(err)
					}
					res, _, err := s.admitErr(lua.AdmitArgs{User: user, Quantity: 1, Charges: cs, Limits: lifted})
					return res, err
				}
				if res, err := buy("u1", "d1"); err != nil || res.Outcome != lua.Admitted {
					t.Fatalf("first: %+v %v", res, err)
				}
				// The device's one order is used: refused although the caller says 1e9.
				if res, err := buy("u2", "d1"); err != nil || res.Outcome != lua.LimitReached || res.Limit != 1 {
					t.Fatalf("same device: %+v %v", res, err)
				}
				if res, err := buy("u3", "d3"); err != nil || res.Outcome != lua.Admitted {
					t.Fatalf("second unit of the phone: %+v %v", res, err)
				}
				if res, err := buy("u4", "d4"); err != nil || res.Outcome != lua.LimitReached || res.Limit != 0 {
					t.Fatalf("third unit of the phone: %+v %v", res, err)
				}
				if got := s.remaining(""); got != 98 {
					t.Fatalf("remaining %d", got)
				}

				// Charges that are not one per limit, or count nothing.
				sub := flashgate.Subjects{User: "u5", Phone: "+8613800000005", Device: "d5"}
				cs, _ := s.spec.Charges(sub, 1, time.Now(), loc)
				zero := append([]flashgate.Charge(nil), cs...)
				zero[1].Inc = 0
				for what, bad := range map[string][]flashgate.Charge{
					"a limit left out": cs[:1],
					"none":             nil,
					"swapped":          {cs[1], cs[0]},
					"counting 0":       zero,
				} {
					res, _, err := s.admitErr(lua.AdmitArgs{User: "u5", Quantity: 1, Charges: bad, Limits: lifted})
					if err == nil {
						t.Fatalf("%s: admitted: %+v", what, res)
					}
					if s.held("u5") != 0 || s.remaining("") != 98 {
						t.Fatalf("%s: reserved something", what)
					}
				}
			})
		}
	})
}
