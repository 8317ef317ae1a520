package nginx_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// TestSoldOutAnsweredByNginx: once a sale is sold out, nginx answers its purchases itself (the
// gateway's sold-out 409 is the one answer it keeps, until the end of the current second): the
// gateway's purchase counter stops while the buyers keep coming. Nothing else is kept: two buyers
// with the same body get two orders, a 403 is the gateway's each time, and the retry of an
// accepted order (its Idempotency-Key) gets its 202 even while nginx holds the sold-out copy.
// After a restock the next buyer gets a 202 as soon as nginx's copy is over: no request sent
// more than a second after the gateway's mark cleared gets a 409.
func TestSoldOutAnsweredByNginx(t *testing.T) {
	g := startGateway(t, func(s *flashgate.Sale) { s.Total = 2 })
	// nginx's per-IP limits out of the way: every request of the test comes from 127.0.0.1.
	e := startNginx(t, opts{gateways: []string{g.g.Addr()}, rate: 100000, burst: 100000, conn: 1000})
	s := g.sale
	url := e.base + "/v1/sales/" + s.ID + "/orders"
	body := []byte(`{"quantity":1}`)
	purchases := func() int64 {
		t.Helper()
		return gatewayPurchases(t, g.g.AdminAddr())
	}

	// Before the sale is sold out, nothing is kept.
	first := do(t, "POST", url, g.token(t, "u0"), body, nil)
	if first.Status != 202 {
		t.Fatalf("first purchase: %d %s", first.Status, first.Raw)
	}
	n0 := purchases()
	for range 2 {
		wantError(t, do(t, "POST", url, g.token(t, "u0"), body, nil), 403, string(flashgate.CodeLimitReached))
	}
	if n := purchases() - n0; n != 2 {
		t.Fatalf("two refusals over the per-user limit: the gateway saw %d purchases, want 2 (a 403 must never be kept)", n)
	}
	last := do(t, "POST", url, g.token(t, "u1"), body, map[string]string{"Idempotency-Key": "last-unit"})
	if last.Status != 202 || last.JSON["order_id"] == first.JSON["order_id"] {
		t.Fatalf("second buyer, same body: %d %s (first order %v): a 202 must never be kept", last.Status, last.Raw, first.JSON["order_id"])
	}

	// Sold out: buyers keep coming, one after the other; the gateway sees at most the one
	// request per second that refills nginx's copy.
	n1 := purchases()
	const buyers = 200
	start := time.Now()
	for i := range buyers {
		r := do(t, "POST", url, g.token(t, "late"+strconv.Itoa(i)), body, nil)
		wantError(t, r, 409, string(flashgate.CodeSoldOut))
		if v := r.Header.Get("X-Accel-Expires"); v != "" {
			t.Fatalf("X-Accel-Expires %q reached the client", v)
		}
	}
	secs := int64(time.Since(start)/time.Second) + 1
	if n := purchases() - n1; n > secs+1 {
		t.Fatalf("%d sold-out purchases in %d s through nginx: the gateway saw %d of them, want at most %d (one a second)", buyers, secs, n, secs+1)
	}
	hits := 0
	for _, l := range e.accessLog(3 + buyers) {
		if strings.Contains(l.raw, "cache=HIT") {
			if !strings.Contains(l.raw, `" 409 `) {
				t.Fatalf("a cached answer other than a 409: %s", l.raw)
			}
			hits++
		}
	}
	if hits < buyers-int(secs+1) {
		t.Errorf("%d cache hits in the access log, want at least %d", hits, buyers-int(secs+1))
	}

	// The retry of the order that took the last unit is that order's 202, not the kept 409.
	n2 := purchases()
	retry := do(t, "POST", url, g.token(t, "u1"), body, map[string]string{"Idempotency-Key": "last-unit"})
	if retry.Status != 202 || retry.JSON["order_id"] != last.JSON["order_id"] {
		t.Fatalf("retry with the Idempotency-Key of an accepted order: %d %s, want 202 with order %v", retry.Status, retry.Raw, last.JSON["order_id"])
	}
	if n := purchases() - n2; n != 1 {
		t.Fatalf("the retry reached the gateway %d times, want 1", n)
	}

	// Restock, as the backend's cancel does, then buy again through nginx.
	cleared := restock(t, g, first)
	buyAgain(t, g, url, body, cleared, "nginx kept the sold-out answer past its second")
}

// restock cancels order (an answer of g's gateway) as the backend's cancel does: its units go
// back in Redis and every gateway hears of it. It returns when the gateway's own mark cleared:
// asked directly, a purchase of 0 units is a 409 while the sale is marked sold out (answered
// before the body is read) and a 400 once it is not.
func restock(t *testing.T, g *gw, order reply) time.Time {
	t.Helper()
	s := g.sale
	id, err := strconv.ParseUint(fmt.Sprint(order.JSON["order_id"]), 10, 64)
	if err != nil {
		t.Fatalf("order id %v: %v", order.JSON["order_id"], err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc := testenv.Redis(t, g.cfg.Redis.Addrs)
	rel, err := lua.Load().Release(ctx, rc, lua.KeysFor(s.ID, s.RegionNames()), id, "", "", lua.ReleaseGateway, flashgate.ReasonCanceled)
	if err != nil || !rel.Released {
		t.Fatalf("release: %+v %v", rel, err)
	}
	if err := bus.PublishHint(testenv.NATS(t), g.cfg.NATS, bus.SaleEvent{Type: bus.EventRestocked, SaleID: s.ID}); err != nil {
		t.Fatal(err)
	}
	direct := "http://" + g.g.Addr() + "/v1/sales/" + s.ID + "/orders"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		switch r := do(t, "POST", direct, g.token(t, "probe"), []byte(`{"quantity":0}`), nil); r.Status {
		case 400:
			return time.Now()
		case 409:
			if time.Now().After(deadline) {
				t.Fatal("the gateway still marks the sale sold out 10 s after the restocked event")
			}
		default:
			t.Fatalf("probe: %d %s", r.Status, r.Raw)
		}
	}
}

// buyAgain buys through nginx (url) until a 202: what nginx answers from (its copy, a mark) ends
// with the second it was made in, at the latest the second the gateway's mark cleared in. A
// request sent after that (with 200 ms for nginx's clock, which it reads once per event loop
// turn) must reach the gateway and buy the unit that came back; a 409 for one is what fails.
func buyAgain(t *testing.T, g *gw, url string, body []byte, cleared time.Time, fail string) {
	t.Helper()
	copyOver := cleared.Truncate(time.Second).Add(time.Second + 200*time.Millisecond)
	for i := 0; ; i++ {
		sent := time.Now()
		r := do(t, "POST", url, g.token(t, "again"+strconv.Itoa(i)), body, nil)
		if r.Status == 202 {
			return
		}
		wantError(t, r, 409, string(flashgate.CodeSoldOut))
		if sent.After(copyOver) {
			t.Fatalf("a 409 for a request sent %v after the mark cleared: %s", sent.Sub(cleared), fail)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// gatewayPurchases is the gateway's count of answered purchases (its requests_total metric, route
// purchase, every code).
func gatewayPurchases(t testing.TB, admin string) int64 {
	t.Helper()
	res, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var n int64
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "flashgate_gateway_requests_total{") || !strings.Contains(l, `route="purchase"`) {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", l, err)
		}
		n += int64(v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSoldOutAnsweredFromMarks: with the gateway's sold-out marks (gateway.edge_marks_dir, the
// directory nginx looks in), nginx answers a sold-out sale's purchases from the mark alone: from
// the second after the mark was written, not one of them reaches the gateway, and each is the
// gateway's own 409 (code, body, content type). A purchase with an Idempotency-Key still reaches
// the gateway (it may be the retry of an accepted order, whose answer is its 202). A restock removes the mark: no request
// sent more than a second after the gateway's mark cleared gets a 409, and the unit that came
// back is sold.
func TestSoldOutAnsweredFromMarks(t *testing.T) {
	marks := t.TempDir()
	g := startGatewayWith(t, func(s *flashgate.Sale) { s.Total = 1 }, func(c *config.Config) { c.Gateway.EdgeMarksDir = marks })
	e := startNginx(t, opts{gateways: []string{g.g.Addr()}, rate: 100000, burst: 100000, conn: 1000, marks: marks})
	s := g.sale
	url := e.base + "/v1/sales/" + s.ID + "/orders"
	body := []byte(`{"quantity":1}`)
	purchases := func() int64 {
		t.Helper()
		return gatewayPurchases(t, g.g.AdminAddr())
	}
	marked := func() bool {
		t.Helper()
		m, err := filepath.Glob(filepath.Join(marks, s.ID+".*"))
		if err != nil {
			t.Fatal(err)
		}
		return len(m) > 0
	}

	first := do(t, "POST", url, g.token(t, "u0"), body, map[string]string{"Idempotency-Key": "only-unit"})
	if first.Status != 202 {
		t.Fatalf("first purchase: %d %s", first.Status, first.Raw)
	}
	if marked() {
		t.Fatal("a mark before the sale sold out")
	}
	// The next buyer finds it sold out; the gateway marks it.
	wantError(t, do(t, "POST", url, g.token(t, "u1"), body, nil), 409, string(flashgate.CodeSoldOut))
	for deadline := time.Now().Add(5 * time.Second); !marked(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no mark 5 s after the sale sold out")
		}
	}
	// nginx may have looked for this second's mark before it was written (and remembers the
	// answer for the rest of the second); from the next second on, the mark answers.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 50*time.Millisecond)))
	n1 := purchases()
	const buyers = 200
	for i := range buyers {
		r := do(t, "POST", url, g.token(t, "late"+strconv.Itoa(i)), body, nil)
		wantError(t, r, 409, string(flashgate.CodeSoldOut))
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			t.Fatalf("sold-out answer from the mark: Content-Type %q", ct)
		}
	}
	if n := purchases() - n1; n != 0 {
		t.Fatalf("%d sold-out purchases through nginx with the sale marked: the gateway saw %d of them, want 0", buyers, n)
	}
	// Any body, even a malformed one: sold out is all there is to say of the sale.
	wantError(t, do(t, "POST", url, g.token(t, "late-x"), []byte(`{"quantity":0}`), nil), 409, string(flashgate.CodeSoldOut))

	// A purchase with an Idempotency-Key (it may be the retry of an accepted order) is not
	// answered from the mark: it reaches the gateway.
	n2 := purchases()
	wantError(t, do(t, "POST", url, g.token(t, "keyed"), body, map[string]string{"Idempotency-Key": "keyed-1"}), 409, string(flashgate.CodeSoldOut))
	if n := purchases() - n2; n != 1 {
		t.Fatalf("a purchase with an Idempotency-Key reached the gateway %d times, want 1", n)
	}

	// Restock: the mark goes with the gateway's, and the unit that came back sells.
	cleared := restock(t, g, first)
	if marked() {
		t.Fatal("the mark is still there after the gateway's sold-out flag cleared")
	}
	buyAgain(t, g, url, body, cleared, "nginx answered from a mark past its second")
}
