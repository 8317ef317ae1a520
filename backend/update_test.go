package backend

import (
	"strings"
	"testing"
	"time"

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
