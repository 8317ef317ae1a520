package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/config"
)

type answer struct {
	status int
	Code   string `json:"code"`
	Order  string `json:"order_id"`
	State  string `json:"status"`
	Reason string `json:"reason"`
}

func call(t *testing.T, cfg config.Config, method, url, user string) answer {
	t.Helper()
	tok, _ := auth.MintHS256(cfg.Auth.JWTSecret, user, auth.MintOptions{})
	req, _ := http.NewRequest(method, url, strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	a := answer{status: res.StatusCode}
	_ = json.Unmarshal(b, &a)
	return a
}

// TestPayAndCancelThroughTheGateway: the public API of an order's life, end to
// end: buy, the payment service pays; buy, cancel, and the canceled unit sells again — to someone
// else, never to the buyer who canceled: within the sale a cancel gives the units back, not the
// buyer's quota (a scalper's hand-off from one account to a waiting one).
func TestPayAndCancelThroughTheGateway(t *testing.T) {
	cfg := e2eConfig(t)
	be := startBackend(t, cfg)
	gw := startGateway(t, cfg)
	s := newSale(2, 1)
	createSale(t, cfg, be.AdminAddr(), s)
	awaitSale(t, gw, s.ID)
	base := "http://" + gw.Addr() + "/v1/sales/" + s.ID + "/orders"

	confirmed := func(user, id string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for call(t, cfg, "GET", base+"/"+id, user).State != "confirmed" {
			if time.Now().After(deadline) {
				t.Fatalf("order %s never confirmed", id)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	a := call(t, cfg, "POST", base, "alice")
	b := call(t, cfg, "POST", base, "bob")
	if a.status != 202 || b.status != 202 {
		t.Fatalf("purchases: %d %d", a.status, b.status)
	}
	if r := call(t, cfg, "POST", base, "carol"); r.status != 409 {
		t.Fatalf("third buyer of two units: %d %s", r.status, r.Code)
	}
	confirmed("alice", a.Order)
	confirmed("bob", b.Order)

	// A buyer never marks an order paid (403); the payment service does.
	if r := call(t, cfg, "POST", base+"/"+a.Order+"/pay", "alice"); r.status != 403 || r.Code != "forbidden" {
		t.Fatalf("alice marks her order paid: %d %+v", r.status, r)
	}
	if r := pay(t, gw.Addr(), paymentBody(s.ID, a.Order, "pi_a", s.PriceCents), cfg.Payments.Secret...); r.status != 200 || r.State != "paid" {
		t.Fatalf("alice's payment: %d %s", r.status, r.raw)
	}
	if r := call(t, cfg, "POST", base+"/"+a.Order+"/cancel", "alice"); r.status != 409 || r.Code != "order_closed" {
		t.Fatalf("cancel a paid order: %d %+v", r.status, r)
	}
	if r := call(t, cfg, "POST", base+"/"+b.Order+"/cancel", "bob"); r.status != 200 || r.State != "canceled" {
		t.Fatalf("bob cancels: %d %+v", r.status, r)
	}
	if r := pay(t, gw.Addr(), paymentBody(s.ID, b.Order, "pi_b", s.PriceCents), cfg.Payments.Secret...); r.status != 409 || r.Code != "order_closed" {
		t.Fatalf("a payment of a canceled order: %d %s", r.status, r.raw)
	}
	// Bob's unit is for sale again: carol gets it (once the sold-out mark
	// clears, by event or refresh); after her cancel, bob may not buy again
	// (403 limit_reached), while dave can.
	deadline := time.Now().Add(10 * time.Second)
	var c answer
	for c = call(t, cfg, "POST", base, "carol"); c.status != 202; c = call(t, cfg, "POST", base, "carol") {
		if time.Now().After(deadline) {
			t.Fatalf("the canceled unit never sold again: %d %s", c.status, c.Code)
		}
		time.Sleep(50 * time.Millisecond)
	}
	confirmed("carol", c.Order)
	if r := call(t, cfg, "POST", base+"/"+c.Order+"/cancel", "carol"); r.status != 200 {
		t.Fatalf("carol cancels: %d", r.status)
	}
	deadline = time.Now().Add(10 * time.Second)
	r := call(t, cfg, "POST", base, "bob")
	// The sold-out mark until it clears (409), and the per-user rate limit meanwhile (429).
	for ; r.status == 409 || r.status == 429; r = call(t, cfg, "POST", base, "bob") {
		if time.Now().After(deadline) {
			t.Fatalf("the sale stayed sold out after carol's cancel: %d %s", r.status, r.Code)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r.status != 403 || r.Code != "limit_reached" {
		t.Fatalf("bob buys again within the sale after his cancel: %d %s, want 403 limit_reached", r.status, r.Code)
	}
	if r := call(t, cfg, "POST", base, "dave"); r.status != 202 {
		t.Fatalf("the unit carol gave back, for dave: %d %s", r.status, r.Code)
	}
}
