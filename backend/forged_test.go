package backend

import (
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// A publisher that lies about an order's charges (a compromised gateway: it
// admits and publishes with charges of its own making) gets nothing: the
// backend works the charges out from the order's facts and the sale's limits
// in MySQL, refuses the order (failed, bad_charges), gives its units and its
// counted charges back to Redis, and counts it in charges_refused_total. An
// honest order beside it is confirmed.
func TestForgedChargesRefused(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	sale := limitedSpec(20)
	k := s.createSale(sale)
	t.Cleanup(func() { dropLimitKeys(t, s.rc, k, "sale", today()) })
	loc, _ := sale.Location()

	// forge admits for sub with charges cs, and publishes what a gateway
	// would, facts and all, with charges sent.
	forge := func(sub flashgate.Subjects, cs, sent []flashgate.Charge) flashgate.Order {
		t.Helper()
		now := time.Now()
		a := lua.AdmitArgs{User: sub.User, Quantity: 1, OrderID: nextID.Add(1), Now: now, PayBy: now.Add(15 * time.Minute),
			Charges: cs, Limits: sale.Limits}
		got, err := s.scripts.Admit(ctx(t), s.rc, k, a)
		if err != nil || got.Outcome != lua.Admitted {
			t.Fatalf("admit %+v: %+v, %v", sub, got, err)
		}
		m := flashgate.Order{ID: got.OrderID, SaleID: sale.ID, UserID: sub.User, Quantity: 1, CreatedAt: ms(now.UnixMilli()),
			ExpiresAt: ms(a.PayBy.UnixMilli()), Charges: flashgate.EncodeCharges(sent),
			Phone: sub.Phone, Device: sub.Device, IP: sub.IP, Address: sub.Address}
		s.publish(m)
		return m
	}
	charges := func(sub flashgate.Subjects) []flashgate.Charge {
		cs, err := sale.Charges(sub, 1, time.Now(), loc)
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}

	// The address limit left out of the message: MySQL would not count the
	// address's one order.
	omit := flashgate.Subjects{User: "f1", Phone: "+8613800000001", Address: "addr1"}
	omitted := forge(omit, charges(omit), charges(omit)[:1])
	// Charged to somebody else's phone than the one the order is by.
	other := flashgate.Subjects{User: "f2", Phone: "+8613800000002", Address: "addr2"}
	cs := charges(other)
	cs[0].Subject = "+8613800000099"
	elsewhere := forge(other, cs, cs)
	honest := admitSub(t, s.rc, k, sale, flashgate.Subjects{User: "h", Phone: "+8613800000003", Address: "addr3"}, 1)
	s.publish(honest)

	eventually(t, 15*time.Second, "3 orders decided", func() bool {
		return s.rows(sale.ID, "confirmed")+s.rows(sale.ID, "failed") == 3
	})
	for _, m := range []flashgate.Order{omitted, elsewhere} {
		if st, why, _ := s.order(m.ID); st != "failed" || why != flashgate.ReasonBadCharges {
			t.Fatalf("forged order %d: %s/%s", m.ID, st, why)
		}
		eventually(t, 10*time.Second, "failed in Redis", func() bool {
			st, why := redisStatus(t, s.rc, k, m.ID)
			return st == "failed" && why == flashgate.ReasonBadCharges
		})
	}
	if st, _, _ := s.order(honest.ID); st != "confirmed" {
		t.Fatalf("honest order: %s", st)
	}
	// Units and counted charges back: only the honest order holds any.
	if got := remaining(t, s.rc, k, ""); got != 19 {
		t.Fatalf("remaining %d, want 19", got)
	}
	day := today()
	for _, c := range []struct {
		lim             int
		window, subject string
	}{{0, day, "+8613800000001"}, {1, "sale", "addr1"}, {0, day, "+8613800000099"}, {1, "sale", "addr2"}} {
		if n := redisCounter(t, s.rc, k, c.window, c.lim, c.subject); n != 0 {
			t.Errorf("Redis counter %d/%s/%s = %d after the refusal", c.lim, c.window, c.subject, n)
		}
		if n := s.used(sale.ID, c.lim, c.window, c.subject); n != 0 {
			t.Errorf("limit_usage %d/%s/%s = %d", c.lim, c.window, c.subject, n)
		}
	}
	if n := s.sold(sale.ID); n != 1 {
		t.Fatalf("MySQL sold %d", n)
	}
	if n := metric(s.scrape(), "flashgate_backend_charges_refused_total"); n != 2 {
		t.Fatalf("charges_refused_total %v, want 2", n)
	}
}
