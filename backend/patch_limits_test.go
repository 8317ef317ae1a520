package backend

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// TestPatchedLimitsReachEveryWriter: a writer that cached a sale's limits
// (another backend than the one serving the PATCH) judges every order by the
// limits MySQL holds at the moment of its transaction. Before, its shape was
// cached for good: an order using the headroom of a raised limit, admitted by
// Redis (a 202), failed limit_reached in MySQL; after a lowering, MySQL let an
// order through under the old, looser limit.
func TestPatchedLimitsReachEveryWriter(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil) // serves the PATCH
	tok := s.cfg.Admin.Token
	sale := limitedSpec(20) // phone: 2 units a day; address: 1 order; per_user_limit 20
	body, _ := json.Marshal(sale)
	if status, b := s.call("POST", "/admin/v1/sales", tok, string(body)); status != 201 {
		t.Fatalf("create: %d %v", status, b)
	}
	k := lua.KeysFor(sale.ID, nil)
	t.Cleanup(func() { dropLimitKeys(t, s.rc, k, "sale", today()) })
	path := "/admin/v1/sales/" + sale.ID
	w := s.w // another backend's writer: it caches the sale's shape on its first batch

	p1 := "+8613800000001"
	m1 := admitSub(t, s.rc, k, sale, flashgate.Subjects{User: "u1", Phone: p1, Address: "a1"}, 2)
	if out := s.process(sale.ID, []flashgate.Order{m1}); out[0].Status != flashgate.OrderConfirmed {
		t.Fatalf("first order: %+v", out[0])
	}
	if _, cached := w.shapes[sale.ID]; !cached {
		t.Fatal("the writer cached no shape")
	}

	// Raise: the phone limit goes from 2 to 4 units a day.
	limits := func(phoneMax int64) string {
		return `{"limits":[{"dimension":"phone","max":` + strconv.FormatInt(phoneMax, 10) +
			`,"of":"units","per":"day"},{"dimension":"address","max":1,"of":"orders","per":"sale"}]}`
	}
	if status, b := s.call("PATCH", path, tok, limits(4)); status != 200 {
		t.Fatalf("raise the phone limit: %d %v", status, b)
	}
	sale.Limits[0].Max = 4
	// Redis admits two more units of p1 (a 202): MySQL must confirm them.
	m2 := admitSub(t, s.rc, k, sale, flashgate.Subjects{User: "u2", Phone: p1, Address: "a2"}, 2)
	out := s.process(sale.ID, []flashgate.Order{m2})
	if out[0].Status != flashgate.OrderConfirmed {
		t.Fatalf("an order in the raised limit's headroom: %s %s, want confirmed", out[0].Status, out[0].Reason)
	}
	if got := s.used(sale.ID, 0, today(), p1); got != 4 {
		t.Fatalf("MySQL counts %d units of p1, want 4", got)
	}
	eventually(t, 5*time.Second, "confirmed in Redis", func() bool {
		st, _ := redisStatus(t, s.rc, k, m2.ID)
		return st == string(flashgate.OrderConfirmed)
	})

	// Lower: per_user_limit from 20 to 3 (u1 holds 2). An order Redis
	// admitted under the old limit (planted: the PATCH raced it) for 2 more
	// units of u1 is MySQL's to judge: past the new limit, it fails.
	if status, b := s.call("PATCH", path, tok, `{"per_user_limit":3}`); status != 200 {
		t.Fatalf("lower per_user_limit: %d %v", status, b)
	}
	now := time.Now()
	loc, _ := sale.Location()
	sub := flashgate.Subjects{User: "u1", Phone: "+8613800000003", Address: "a3"}
	cs, err := sale.Charges(sub, 2, now, loc)
	if err != nil {
		t.Fatal(err)
	}
	m3 := flashgate.Order{ID: nextID.Add(1), SaleID: sale.ID, UserID: "u1", Quantity: 2, Status: flashgate.OrderPending,
		CreatedAt: ms(now.UnixMilli()), ExpiresAt: ms(now.Add(15 * time.Minute).UnixMilli()),
		Charges: flashgate.EncodeCharges(cs), Phone: sub.Phone, Address: sub.Address}
	plant(t, s.rc, k, m3)
	out = s.process(sale.ID, []flashgate.Order{m3})
	if out[0].Status != flashgate.OrderFailed || out[0].Reason != flashgate.ReasonLimitReached {
		t.Fatalf("an order past the lowered per_user_limit: %s %s, want failed %s", out[0].Status, out[0].Reason,
			flashgate.ReasonLimitReached)
	}
	if got := s.units(sale.ID, "u1"); got != 2 {
		t.Fatalf("MySQL counts %d units of u1, want 2 (limit 3)", got)
	}
	// Within the new limit the writer goes on with whole batches.
	m4 := m3
	m4.ID, m4.Quantity = nextID.Add(1), 1
	cs, _ = sale.Charges(sub, 1, now, loc)
	m4.Charges = flashgate.EncodeCharges(cs)
	plant(t, s.rc, k, m4)
	if out := s.process(sale.ID, []flashgate.Order{m4}); out[0].Status != flashgate.OrderConfirmed {
		t.Fatalf("an order within the lowered limit: %s %s", out[0].Status, out[0].Reason)
	}
	if got := s.units(sale.ID, "u1"); got != 3 {
		t.Fatalf("MySQL counts %d units of u1, want 3", got)
	}
}
