package gateway

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/testenv"
)

// TestPayAndCancelMapBackendReplies: the gateway's half of cancel, and a
// buyer's pay refused (403) without asking anyone.
// A stand-in backend (pure logic: the replies are scripted) answers on the real
// NATS; the backend's own tests cover what it does in MySQL.
func TestPayAndCancelMapBackendReplies(t *testing.T) {
	e := start(t)
	s := e.sale(nil)
	// Rebuilt before the purchase, as a backend's warm does: the buyers'
	// records decide newer ids (orderids.go).
	e.stampRebuilt(s, time.Now().Add(-40*time.Second))
	alice := e.token("alice")
	r := e.buy(s, alice, `{}`, nil)
	if r.Status != 202 {
		t.Fatalf("purchase: %d %s", r.Status, r.Raw)
	}
	path := "/v1/sales/" + s.ID + "/orders/" + r.OrderID

	// No backend answers: 503, never a "no".
	if got := e.do("POST", path+"/cancel", alice, nil, nil); got.Status != 503 || got.Code != "unavailable" {
		t.Fatalf("cancel with no backend: %d %s", got.Status, got.Raw)
	}

	var next atomic.Value
	var seen atomic.Int64
	stub := testenv.NATS(t)
	sub, err := bus.ServeCommands(stub, e.cfg.NATS, func(cmd bus.OrderCommand) bus.OrderReply {
		seen.Add(1)
		if cmd.UserID != "alice" || cmd.SaleID != s.ID || cmd.OrderID == 0 {
			return bus.OrderReply{Code: "invalid_request", Message: "unexpected command"}
		}
		return next.Load().(bus.OrderReply)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := stub.Flush(); err != nil { // the server knows the responder before we ask
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	cases := []struct {
		op     string
		reply  bus.OrderReply
		status int
		code   string
	}{
		{"cancel", bus.OrderReply{Code: bus.ReplyOK, Status: "canceled", Reason: "canceled", Quantity: 1, CreatedAt: now, ExpiresAt: now.Add(time.Minute)}, 200, ""},
		{"cancel", bus.OrderReply{Code: string(flashgate.CodeOrderClosed), Message: "paid orders cannot be canceled"}, 409, "order_closed"},
		{"cancel", bus.OrderReply{Code: string(flashgate.CodeConflict)}, 409, "conflict"},
		{"cancel", bus.OrderReply{Code: string(flashgate.CodeOrderNotFound)}, 404, "order_not_found"},
		{"cancel", bus.OrderReply{Code: string(flashgate.CodeUnavailable)}, 503, "unavailable"},
	}
	for _, c := range cases {
		next.Store(c.reply)
		got := e.do("POST", path+"/"+c.op, alice, nil, nil)
		if got.Status != c.status || (c.code != "" && got.Code != c.code) {
			t.Fatalf("%s answered %+v: %d %s, want %d %s", c.op, c.reply, got.Status, got.Raw, c.status, c.code)
		}
		if c.status == 200 && got.State != c.reply.Status {
			t.Fatalf("%s: status %q in %s", c.op, got.State, got.Raw)
		}
	}
	// Answered at the gateway, without asking a backend: a buyer's pay (only
	// the payment service pays, POST /v1/payments), someone else's order, an
	// order id that does not parse, no token.
	before := seen.Load()
	for _, tok := range []string{alice, e.token("mallory"), ""} {
		if got := e.do("POST", path+"/pay", tok, nil, nil); got.Status != 403 || got.Code != "forbidden" {
			t.Fatalf("a buyer's pay: %d %s", got.Status, got.Raw)
		}
	}
	if got := e.do("POST", path+"/cancel", e.token("mallory"), nil, nil); got.Status != 404 {
		t.Fatalf("another user's cancel: %d %s", got.Status, got.Raw)
	}
	if got := e.do("POST", "/v1/sales/"+s.ID+"/orders/xyz/cancel", alice, nil, nil); got.Status != 404 {
		t.Fatalf("bad order id: %d %s", got.Status, got.Raw)
	}
	if got := e.do("POST", path+"/cancel", "", nil, nil); got.Status != 401 {
		t.Fatalf("no token: %d %s", got.Status, got.Raw)
	}
	if seen.Load() != before {
		t.Fatalf("the backend was asked %d times for requests the gateway can refuse", seen.Load()-before)
	}
}
