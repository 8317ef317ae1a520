package e2e

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/mysql"
)

// paymentAnswer is an answer of POST /v1/payments.
type paymentAnswer struct {
	status      int
	raw         string
	Code        string `json:"code"`
	Refund      *bool  `json:"refund"`
	OrderID     string `json:"order_id"`
	State       string `json:"status"`
	PaymentID   string `json:"payment_id"`
	AmountCents int64  `json:"amount_cents"`
}

// paymentBody is the JSON body of a payment of order id of sale.
func paymentBody(sale, order, paymentID string, amount int64) string {
	return fmt.Sprintf(`{"order_id":%q,"sale_id":%q,"payment_id":%q,"amount_cents":%d}`, order, sale, paymentID, amount)
}

// postPayment sends body to the gateway at addr with the Flashgate-Signature
// header sig ("" for none).
func postPayment(t *testing.T, addr, body, sig string) paymentAnswer {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/payments", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if sig != "" {
		req.Header.Set(auth.PaymentHeader, sig)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	a := paymentAnswer{status: res.StatusCode, raw: string(b)}
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("payment answer %d %q is not JSON: %v", res.StatusCode, b, err)
	}
	return a
}

// pay signs body now with secrets (the payment service's side) and sends it.
func pay(t *testing.T, addr, body string, secrets ...string) paymentAnswer {
	t.Helper()
	return postPayment(t, addr, body, auth.PaymentSignature(secrets, time.Now(), []byte(body)))
}

// buyConfirmed buys qty units as user and answers the order id once the backend
// has confirmed it.
func buyConfirmed(t *testing.T, cfg config.Config, addr, sale, user string, qty int) string {
	t.Helper()
	tok, _ := auth.MintHS256(cfg.Auth.JWTSecret, user, auth.MintOptions{})
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/sales/"+sale+"/orders", strings.NewReader(fmt.Sprintf(`{"quantity":%d}`, qty)))
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var a answer
	_ = json.NewDecoder(res.Body).Decode(&a)
	res.Body.Close()
	if res.StatusCode != 202 {
		t.Fatalf("%s buys %d: %d %s", user, qty, res.StatusCode, a.Code)
	}
	order := "http://" + addr + "/v1/sales/" + sale + "/orders/" + a.Order
	deadline := time.Now().Add(20 * time.Second)
	for call(t, cfg, "GET", order, user).State != "confirmed" {
		if time.Now().After(deadline) {
			t.Fatalf("order %s never confirmed", a.Order)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return a.Order
}

// TestPayments: POST /v1/payments through a real gateway and backend (Redis,
// NATS, MariaDB): the signature (wrong, replayed, two secrets while
// rotating), the amount, the same payment twice, another payment of a paid
// order, late payments of a canceled and an expired order (409 order_closed,
// refund: true, and the units stay on sale: the ledger holds), and the
// buyer's own token on …/pay (403).
func TestPayments(t *testing.T) {
	cfg := e2eConfig(t)
	// Mid-rotation: the gateway takes the new secret and the old one.
	newS, oldS, strange := testenv.Secret("pay-new-"), testenv.Secret("pay-old-"), testenv.Secret("pay-other-")
	cfg.Payments.Secret = config.Secrets{newS, oldS}
	be := startBackend(t, cfg)
	gw := startGateway(t, cfg)
	s := newSale(6, 2)
	s.PerOrderMax, s.PriceCents = 2, 1250
	createSale(t, cfg, be.AdminAddr(), s)
	awaitSale(t, gw, s.ID)
	addr := gw.Addr()
	db, err := mysql.OpenDB(cfg.MySQL.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	alice := buyConfirmed(t, cfg, addr, s.ID, "alice", 2) // costs 2500
	body := paymentBody(s.ID, alice, "pi_alice", 2500)

	// Refused signatures: 401 bad_signature, nothing asked of the backend.
	now := time.Now()
	for _, c := range []struct{ name, sig string }{
		{"no signature", ""},
		{"another secret", auth.PaymentSignature([]string{strange}, now, []byte(body))},
		{"another body", auth.PaymentSignature([]string{newS}, now, []byte(paymentBody(s.ID, alice, "pi_alice", 1)))},
		{"garbage", "t=abc,v1=xyz"},
		{"replayed 6 minutes later", auth.PaymentSignature([]string{newS}, now.Add(-6*time.Minute), []byte(body))},
		{"from 6 minutes ahead", auth.PaymentSignature([]string{newS}, now.Add(6*time.Minute), []byte(body))},
	} {
		if a := postPayment(t, addr, body, c.sig); a.status != 401 || a.Code != "bad_signature" {
			t.Errorf("%s: %d %s, want 401 bad_signature", c.name, a.status, a.raw)
		}
	}
	if st := orderState(t, db, alice); st != "confirmed" {
		t.Fatalf("after refused signatures the order is %s", st)
	}

	// A wrong amount: 409, the order stays payable.
	for _, amount := range []int64{1250, 2499, 0} {
		a := pay(t, addr, paymentBody(s.ID, alice, "pi_alice", amount), newS)
		if a.status != 409 || a.Code != "amount_mismatch" || a.Refund != nil {
			t.Errorf("amount %d: %d %s", amount, a.status, a.raw)
		}
	}
	if st := orderState(t, db, alice); st != "confirmed" {
		t.Fatalf("after wrong amounts the order is %s", st)
	}

	// Signed with the old secret alone (a payment service not rotated yet):
	// paid. The same payment again, signed with the new one alone, with both,
	// or the very same request replayed inside the window: the same 200.
	first := pay(t, addr, body, oldS)
	if first.status != 200 || first.State != "paid" || first.OrderID != alice || first.PaymentID != "pi_alice" || first.AmountCents != 2500 {
		t.Fatalf("payment: %d %s", first.status, first.raw)
	}
	sig := auth.PaymentSignature([]string{newS, oldS}, time.Now(), []byte(body))
	for i, again := range []paymentAnswer{pay(t, addr, body, newS), postPayment(t, addr, body, sig), postPayment(t, addr, body, sig)} {
		if again.status != 200 || again.raw != first.raw {
			t.Errorf("the same payment again (#%d): %d %s, want %d %s", i, again.status, again.raw, first.status, first.raw)
		}
	}
	var pid string
	var amount int64
	if err := db.QueryRow(`SELECT payment_id, amount_cents FROM orders WHERE id = ?`, alice).Scan(&pid, &amount); err != nil || pid != "pi_alice" || amount != 2500 {
		t.Fatalf("the order's row keeps payment %q %d (%v)", pid, amount, err)
	}
	// Another payment of the paid order: 409 already_paid (docs/payments.md).
	if a := pay(t, addr, paymentBody(s.ID, alice, "pi_alice_2", 2500), newS); a.status != 409 || a.Code != "already_paid" || a.Refund != nil {
		t.Errorf("another payment of a paid order: %d %s", a.status, a.raw)
	}
	// No such order; a body that does not parse (signed).
	if a := pay(t, addr, paymentBody(s.ID, "12345", "pi_x", 1250), newS); a.status != 404 || a.Code != "order_not_found" {
		t.Errorf("an unknown order: %d %s", a.status, a.raw)
	}
	if a := pay(t, addr, `{"order_id":"`+alice+`","sale_id":"`+s.ID+`","payment_id":"pi_alice"}`, newS); a.status != 400 || a.Code != "invalid_request" {
		t.Errorf("a body without amount_cents: %d %s", a.status, a.raw)
	}

	// The buyer's own token on …/pay: 403, whatever the order.
	bob := buyConfirmed(t, cfg, addr, s.ID, "bob", 1)
	if r := call(t, cfg, "POST", "http://"+addr+"/v1/sales/"+s.ID+"/orders/"+bob+"/pay", "bob"); r.status != 403 || r.Code != "forbidden" {
		t.Fatalf("the buyer pays his own order: %d %s", r.status, r.Code)
	}
	if st := orderState(t, db, bob); st != "confirmed" {
		t.Fatalf("after the buyer's pay the order is %s", st)
	}

	// Late payments: bob canceled, carol's order expired (its deadline moved
	// into the past in MySQL, which decides). 409 order_closed, refund: true;
	// what the cancel and the expiry gave back stays on sale.
	if r := call(t, cfg, "POST", "http://"+addr+"/v1/sales/"+s.ID+"/orders/"+bob+"/cancel", "bob"); r.status != 200 {
		t.Fatalf("bob cancels: %d %s", r.status, r.Code)
	}
	carol := buyConfirmed(t, cfg, addr, s.ID, "carol", 1)
	if _, err := db.Exec(`UPDATE orders SET expires_at = ? WHERE id = ?`, time.Now().Add(-time.Second).UTC(), carol); err != nil {
		t.Fatal(err)
	}
	accepted := []uint64{parseID(t, alice), parseID(t, bob), parseID(t, carol)}
	late := func(what, order, paymentID string) {
		t.Helper()
		a := pay(t, addr, paymentBody(s.ID, order, paymentID, 1250), newS)
		if a.status != 409 || a.Code != "order_closed" || a.Refund == nil || !*a.Refund {
			t.Errorf("a payment of %s: %d %s, want 409 order_closed refund:true", what, a.status, a.raw)
		}
	}
	late("a canceled order", bob, "pi_bob")
	// (The sweeper may expire carol's order first; either way it is closed.)
	late("an expired order", carol, "pi_carol")
	if st := orderState(t, db, carol); st != "canceled" {
		t.Fatalf("carol's order is %s, want canceled (expired)", st)
	}
	before := drain(t, cfg, s.ID, accepted)
	// Late again, and late with another payment id: still closed, and
	// nothing is taken back from the stock.
	late("a canceled order, again", bob, "pi_bob")
	late("an expired order, again", carol, "pi_carol_2")
	after := drain(t, cfg, s.ID, accepted)
	assertInvariants(t, after)
	// Only alice's 2 paid units are sold: bob's and carol's went back on sale
	// and stayed there.
	if after.Sold != 2 || after.RedisRemaining != s.Total-2 || before.Sold != after.Sold || before.RedisRemaining != after.RedisRemaining {
		t.Fatalf("sold %d→%d, remaining %d→%d: want 2 and %d throughout", before.Sold, after.Sold,
			before.RedisRemaining, after.RedisRemaining, s.Total-2)
	}
	var paidUnits int64
	if err := db.QueryRow(`SELECT COALESCE(SUM(quantity), 0) FROM orders WHERE sale_id = ? AND status = 'paid'`, s.ID).Scan(&paidUnits); err != nil || paidUnits != 2 {
		t.Fatalf("paid units %d (%v), want 2", paidUnits, err)
	}
	if n := countRows(t, db, `SELECT COUNT(*) FROM orders WHERE id IN (?, ?) AND payment_id IS NOT NULL`, bob, carol); n != 0 {
		t.Fatalf("a late payment was recorded on %d orders", n)
	}
}

// orderState is the order's status in MySQL.
func orderState(t *testing.T, db *sql.DB, id string) string {
	t.Helper()
	var st string
	if err := db.QueryRow(`SELECT status FROM orders WHERE id = ?`, id).Scan(&st); err != nil {
		t.Fatalf("order %s: %v", id, err)
	}
	return st
}

func parseID(t *testing.T, id string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(id, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func countRows(t *testing.T, db *sql.DB, q string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
