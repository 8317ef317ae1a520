package gateway

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/testenv"
)

// TestPaymentsMapBackendReplies: the gateway's half of POST /v1/payments on
// the real NATS. A stand-in backend (its replies scripted: pure logic) sees
// exactly the payment signed, and only once the signature and the body are
// good; each reply becomes its documented answer. The backend's half is
// backend.TestPaymentRecorded, the whole path e2e.TestPayments.
func TestPaymentsMapBackendReplies(t *testing.T) {
	e := start(t)
	secret := e.cfg.Payments.Secret[0]
	body := `{"order_id":"384390657912123392","sale_id":"s1","payment_id":"pi_1","amount_cents":2500}`
	signed := func(b string) map[string]string {
		return map[string]string{auth.PaymentHeader: auth.PaymentSignature([]string{secret}, time.Now(), []byte(b))}
	}

	// No backend answers: 503, never a "no".
	if got := e.do("POST", "/v1/payments", "", []byte(body), signed(body)); got.Status != 503 || got.Code != "unavailable" || got.RetryAfter == "" {
		t.Fatalf("payment with no backend: %d %s", got.Status, got.Raw)
	}

	var next atomic.Value
	var seen atomic.Int64
	stub := testenv.NATS(t)
	sub, err := bus.ServeCommands(stub, e.cfg.NATS, func(cmd bus.OrderCommand) bus.OrderReply {
		seen.Add(1)
		want := bus.PayCommand(flashgate.Payment{OrderID: 384390657912123392, SaleID: "s1", PaymentID: "pi_1", AmountCents: 2500})
		if cmd != want {
			return bus.OrderReply{Code: "invalid_request", Message: "unexpected command"}
		}
		return next.Load().(bus.OrderReply)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := stub.Flush(); err != nil {
		t.Fatal(err)
	}

	// Refused before any backend is asked.
	for _, c := range []struct {
		name, body string
		hdr        map[string]string
		status     int
		code       string
	}{
		{"no signature", body, nil, 401, "bad_signature"},
		{"another secret", body, map[string]string{auth.PaymentHeader: auth.PaymentSignature([]string{testenv.Secret("x-")}, time.Now(), []byte(body))}, 401, "bad_signature"},
		{"replayed late", body, map[string]string{auth.PaymentHeader: auth.PaymentSignature([]string{secret}, time.Now().Add(-10*time.Minute), []byte(body))}, 401, "bad_signature"},
		{"an unknown field", `{"order_id":"1","sale_id":"s1","payment_id":"p","amount_cents":1,"x":1}`, nil, 400, "invalid_request"},
		{"order id a number", `{"order_id":1,"sale_id":"s1","payment_id":"p","amount_cents":1}`, nil, 400, "invalid_request"},
		{"no amount", `{"order_id":"1","sale_id":"s1","payment_id":"p"}`, nil, 400, "invalid_request"},
		{"a negative amount", `{"order_id":"1","sale_id":"s1","payment_id":"p","amount_cents":-1}`, nil, 400, "invalid_request"},
		{"a bad payment id", `{"order_id":"1","sale_id":"s1","payment_id":"p p","amount_cents":1}`, nil, 400, "invalid_request"},
		{"not JSON", `order=1`, nil, 400, "invalid_request"},
	} {
		hdr := c.hdr
		if hdr == nil && c.status == 400 {
			hdr = signed(c.body)
		}
		if got := e.do("POST", "/v1/payments", "", []byte(c.body), hdr); got.Status != c.status || got.Code != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, got.Status, got.Raw, c.status, c.code)
		}
	}
	if got := e.do("GET", "/v1/payments", "", nil, nil); got.Status != 405 {
		t.Errorf("GET /v1/payments: %d %s", got.Status, got.Raw)
	}
	if n := seen.Load(); n != 0 {
		t.Fatalf("the backend was asked %d times for payments the gateway refuses", n)
	}

	for _, c := range []struct {
		reply  bus.OrderReply
		status int
		code   string
		raw    string // the whole body, when it is fixed
	}{
		{bus.OrderReply{Code: bus.ReplyOK, Status: "paid", Quantity: 2}, 200, "",
			`{"order_id":"384390657912123392","sale_id":"s1","status":"paid","payment_id":"pi_1","amount_cents":2500}`},
		{bus.OrderReply{Code: string(flashgate.CodeOrderClosed), Message: "the order expired unpaid", Status: "canceled"}, 409, "order_closed",
			`{"code":"order_closed","message":"the order expired unpaid","refund":true}`},
		{bus.OrderReply{Code: string(flashgate.CodeAmountMismatch), Message: "m"}, 409, "amount_mismatch", `{"code":"amount_mismatch","message":"m"}`},
		{bus.OrderReply{Code: string(flashgate.CodeAlreadyPaid), Message: "m"}, 409, "already_paid", ""},
		{bus.OrderReply{Code: string(flashgate.CodePaymentIDUsed), Message: "m"}, 409, "payment_id_used", ""},
		{bus.OrderReply{Code: string(flashgate.CodeConflict)}, 409, "conflict", ""},
		{bus.OrderReply{Code: string(flashgate.CodeOrderNotFound)}, 404, "order_not_found", ""},
		{bus.OrderReply{Code: string(flashgate.CodeUnavailable)}, 503, "unavailable", ""},
	} {
		next.Store(c.reply)
		got := e.do("POST", "/v1/payments", "", []byte(body), signed(body))
		if got.Status != c.status || got.Code != c.code || (c.raw != "" && string(got.Raw) != c.raw) {
			t.Errorf("backend answered %+v: %d %s, want %d %s %s", c.reply, got.Status, got.Raw, c.status, c.code, c.raw)
		}
		if c.code == "conflict" && got.RetryAfter == "" {
			t.Errorf("conflict without Retry-After")
		}
	}
}

// FuzzParsePayment: no body makes the parse panic, and what it accepts is a
// valid payment.
func FuzzParsePayment(f *testing.F) {
	f.Add([]byte(`{"order_id":"7","sale_id":"s","payment_id":"pi_1","amount_cents":100}`))
	f.Add([]byte(`{"order_id":"7","sale_id":"s","payment_id":"pi_1","amount_cents":100,"order_id":"8"}`))
	f.Add([]byte(`{"order_id":"7"} {}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parsePayment(b)
		if err == nil && p.Validate() != nil {
			t.Fatalf("%q: accepted %+v", b, p)
		}
	})
}
