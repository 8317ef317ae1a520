package backend

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// TestSaleUpdate: PATCH /admin/v1/sales/{sale} changes a live sale's window,
// total and limits in MySQL and Redis together, and refuses (409, with the
// reason) what would invalidate a count already taken: a per_user_limit below
// what a buyer bought, a total below what is sold or reserved, a start moved
// after the start. GET /admin/v1/sales lists it.
func TestSaleUpdate(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	tok := s.cfg.Admin.Token
	events := make(chan bus.SaleEvent, 16)
	sub, err := bus.SubscribeEvents(s.nc, s.cfg.NATS, func(ev bus.SaleEvent) { events <- ev })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := s.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	id := testenv.ID("upd")
	cleanRedisID(t, s.rc, id)
	if status, body := s.call("POST", "/admin/v1/sales", tok, saleBody(id, 10, 3, `,"per_order_max":3`)); status != 201 {
		t.Fatalf("create: %d %v", status, body)
	}
	nextEvent(t, events)
	k := lua.KeysFor(id, nil)
	// b1 buys 2 units (written to MySQL); b2 holds 1 reserved unit in Redis only.
	m := admit(t, s.rc, k, "b1", 2, "")
	s.publish(m)
	eventually(t, 10*time.Second, "b1's order", func() bool { return s.rows(id, "confirmed") == 1 })
	eventually(t, 5*time.Second, "reservation settled", func() bool { return reservations(t, s.rc, k) == 0 })
	admit(t, s.rc, k, "b2", 1, "")

	path := "/admin/v1/sales/" + id
	future := time.Now().Add(2 * time.Hour).UTC().Truncate(time.Millisecond)
	for _, tc := range []struct {
		name, token, body string
		status            int
		code, why         string
	}{
		{"no token", "", `{"total":5}`, 401, "unauthorized", ""},
		{"nothing to change", tok, `{}`, 400, "invalid_request", "nothing to change"},
		{"unknown field", tok, `{"colour":"red"}`, 400, "invalid_request", "colour"},
		{"invalid", tok, `{"per_order_max":0}`, 400, "invalid_request", ""},
		{"limit below a buyer's units", tok, `{"per_user_limit":1,"per_order_max":1}`, 409, "conflict", "2 units a buyer already bought"},
		{"total below sold", tok, `{"total":1,"per_user_limit":1,"per_order_max":1}`, 409, "conflict", "below the 2 units sold"},
		{"total takes reserved units", tok, `{"total":2,"per_user_limit":2,"per_order_max":2}`, 409, "conflict", "7 units are left unreserved"},
		{"start moved after the start", tok, `{"starts_at":"` + time.Now().Add(30*time.Minute).UTC().Format(time.RFC3339) + `"}`, 409, "conflict", "cannot move"},
		{"end in the past", tok, `{"ends_at":"` + time.Now().Add(-30*time.Second).UTC().Format(time.RFC3339) + `"}`, 409, "conflict", "sale close"},
	} {
		status, body := s.call("PATCH", path, tc.token, tc.body)
		msg, _ := body["message"].(string)
		if status != tc.status || body["code"] != tc.code || !strings.Contains(msg, tc.why) {
			t.Errorf("%s: %d %v, want %d %s %q", tc.name, status, body, tc.status, tc.code, tc.why)
		}
	}
	if status, body := s.call("PATCH", "/admin/v1/sales/"+id+"x", tok, `{"total":5}`); status != 404 || body["code"] != "sale_not_found" {
		t.Errorf("no such sale: %d %v", status, body)
	}
	// Nothing refused changed anything.
	if got, err := lua.LoadSale(ctx(t), s.rc, id); err != nil || got.Total != 10 || got.PerUserLimit != 3 {
		t.Fatalf("redis after refusals: %+v %v", got, err)
	}

	status, body := s.call("PATCH", path, tok, `{"total":5,"per_user_limit":2,"per_order_max":2,"ends_at":"`+future.Format(time.RFC3339Nano)+`"}`)
	if status != 200 || body["total"] != float64(5) || body["per_user_limit"] != float64(2) {
		t.Fatalf("update: %d %v", status, body)
	}
	if ev := nextEvent(t, events); ev.Type != bus.EventCreated || ev.Sale == nil || ev.Sale.Total != 5 || !ev.Sale.EndsAt.Equal(future) {
		t.Errorf("event of the update: %+v", ev)
	}
	got, err := lua.LoadSale(ctx(t), s.rc, id)
	if err != nil || got.Total != 5 || got.PerUserLimit != 2 || !got.EndsAt.Equal(future) {
		t.Fatalf("redis meta after the update: %+v %v", got, err)
	}
	// Invariant 3 still holds: remaining 2 + reserved 1 + sold 2 = 5.
	status, body = s.call("GET", path, tok, "")
	inv, _ := body["invariant3"].(map[string]any)
	if status != 200 || inv["holds"] != true || body["remaining"] != float64(2) || body["total"] != float64(5) {
		t.Errorf("ledger after the update: %d %v", status, body)
	}

	status, body = s.call("GET", "/admin/v1/sales", tok, "")
	found := false
	list, _ := body["sales"].([]any)
	for _, x := range list {
		if m, _ := x.(map[string]any); m["id"] == id {
			found = m["total"] == float64(5) && m["sold"] == float64(2)
		}
	}
	if status != 200 || !found {
		t.Errorf("list: %d, sale %s with total 5 and sold 2 not in %v", status, id, body)
	}
	if status, body := s.call("GET", "/admin/v1/sales?limit=0", tok, ""); status != 400 {
		t.Errorf("list with limit 0: %d %v", status, body)
	}

	if status, _ := s.call("POST", path+"/close", tok, ""); status != 200 {
		t.Fatalf("close: %d", status)
	}
	if status, body := s.call("PATCH", path, tok, `{"total":6}`); status != 409 || !strings.Contains(body["message"].(string), "closed") {
		t.Errorf("update of a closed sale: %d %v", status, body)
	}
}

// TestSaleUpdateLimits: a live sale's purchase limits can take new maxima,
// but not fall below what a subject has used in the current window, whether
// MySQL has written it or Redis holds it reserved; what a limit counts and
// over which window cannot change.
func TestSaleUpdateLimits(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	tok := s.cfg.Admin.Token
	sale := limitedSpec(20) // phone: 2 units a day; address: 1 order
	body, _ := json.Marshal(sale)
	if status, b := s.call("POST", "/admin/v1/sales", tok, string(body)); status != 201 {
		t.Fatalf("create: %d %v", status, b)
	}
	k := lua.KeysFor(sale.ID, nil)
	t.Cleanup(func() { dropLimitKeys(t, s.rc, k, "sale", today()) })
	p1 := "+8613800000001"
	m := admitSub(t, s.rc, k, sale, flashgate.Subjects{User: "u1", Phone: p1, Address: "a1"}, 2)
	s.publish(m)
	eventually(t, 10*time.Second, "u1's order", func() bool { return s.rows(sale.ID, "confirmed") == 1 })
	admitSub(t, s.rc, k, sale, flashgate.Subjects{User: "u2", Phone: "+8613800000002", Address: "a2"}, 1)

	limits := func(phoneMax int64, extra string) string {
		return `{"limits":[{"dimension":"phone","max":` + strconv.FormatInt(phoneMax, 10) +
			`,"of":"units","per":"day"},{"dimension":"address","max":1,"of":"orders","per":"sale"}` + extra + `]}`
	}
	path := "/admin/v1/sales/" + sale.ID
	for _, tc := range []struct {
		name, body, why string
	}{
		{"below what MySQL counted", limits(1, ""), "below the 2 one subject already used"},
		{"a limit added", limits(2, `,{"dimension":"ip","max":5}`), "not be added or removed"},
		{"what it counts changed", `{"limits":[{"dimension":"phone","max":2,"of":"orders","per":"day"},{"dimension":"address","max":1,"of":"orders"}]}`, "only its max can change"},
	} {
		status, b := s.call("PATCH", path, tok, tc.body)
		if msg, _ := b["message"].(string); status != 409 || !strings.Contains(msg, tc.why) {
			t.Errorf("%s: %d %v, want 409 %q", tc.name, status, b, tc.why)
		}
	}
	if status, b := s.call("PATCH", path, tok, limits(3, "")); status != 200 {
		t.Fatalf("raise the phone limit: %d %v", status, b)
	}
	got, err := lua.LoadSale(ctx(t), s.rc, sale.ID)
	if err != nil || len(got.Limits) != 2 || got.Limits[0].Max != 3 {
		t.Fatalf("redis after raising: %+v %v", got, err)
	}
	// p1 takes a third unit, reserved in Redis only: MySQL still counts 2.
	sale.Limits[0].Max = 3
	admitSub(t, s.rc, k, sale, flashgate.Subjects{User: "u3", Phone: p1, Address: "a3"}, 1)
	status, b := s.call("PATCH", path, tok, limits(2, ""))
	if msg, _ := b["message"].(string); status != 409 || !strings.Contains(msg, "used 3") {
		t.Fatalf("lower below what Redis holds: %d %v", status, b)
	}
	got, err = lua.LoadSale(ctx(t), s.rc, sale.ID)
	if err != nil || got.Limits[0].Max != 3 {
		t.Fatalf("redis after a refused lowering: %+v %v", got, err)
	}
	status, b = s.call("GET", path, tok, "")
	if sp, _ := b["sale"].(map[string]any); status != 200 || sp["limits"].([]any)[0].(map[string]any)["max"] != float64(3) {
		t.Fatalf("MySQL after a refused lowering: %d %v", status, b)
	}
}
