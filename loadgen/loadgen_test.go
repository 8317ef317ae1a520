package loadgen

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// fakeGateway answers the first k purchases 202 with order ids 1001, 1002, …
// and every later one 409 sold_out, and records who asked. It stands in for
// the gateway: what is tested here is the load generator's own logic.
type fakeGateway struct {
	k     int64
	delay time.Duration
	n     atomic.Int64

	mu    sync.Mutex
	users map[string]int
	idem  map[string]int
	paths map[string]int
	body  map[string]int
}

func startFake(t *testing.T, k int64, delay time.Duration) (*fakeGateway, string) {
	t.Helper()
	g := &fakeGateway{k: k, delay: delay, users: map[string]int{}, idem: map[string]int{},
		paths: map[string]int{}, body: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: g.handle}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Shutdown()
		<-done
	})
	return g, "http://" + ln.Addr().String()
}

func (g *fakeGateway) handle(ctx *fasthttp.RequestCtx) {
	if g.delay > 0 {
		time.Sleep(g.delay)
	}
	g.mu.Lock()
	g.users[string(ctx.Request.Header.Peek("Authorization"))]++
	if k := ctx.Request.Header.Peek("Idempotency-Key"); len(k) > 0 {
		g.idem[string(k)]++
	}
	g.paths[string(ctx.Method())+" "+string(ctx.Path())]++
	g.body[string(ctx.PostBody())]++
	g.mu.Unlock()

	ctx.SetContentType("application/json")
	if n := g.n.Add(1); n <= g.k {
		ctx.SetStatusCode(fasthttp.StatusAccepted)
		ctx.SetBodyString(`{"code":"accepted","order_id":"` + strconv.FormatInt(1000+n, 10) + `","status":"pending"}`)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusConflict)
	ctx.SetBodyString(`{"code":"sold_out","message":"sold out"}`)
}

func tokens(n int) [][]byte {
	t := make([][]byte, n)
	for i := range t {
		t[i] = []byte("Bearer user-" + strconv.Itoa(i))
	}
	return t
}

func TestRunRequests(t *testing.T) {
	const users, rounds, k = 50, 4, 37
	g, target := startFake(t, k, 0)
	var progress bytes.Buffer
	res, err := Run(context.Background(), Config{
		Target: target, Sale: "s1", Tokens: tokens(users), Concurrency: 16,
		Requests: users * rounds, Quantity: 2, Region: "bj", Idempotency: true, Progress: &progress,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != users*rounds || res.Errors != 0 {
		t.Fatalf("requests %d errors %d, want %d and 0", res.Requests, res.Errors, users*rounds)
	}
	if got := g.n.Load(); got != users*rounds {
		t.Fatalf("server saw %d requests, want exactly %d", got, users*rounds)
	}
	if res.ByStatus[202] != k || res.ByStatus[409] != users*rounds-k || len(res.ByStatus) != 2 {
		t.Fatalf("by status %v", res.ByStatus)
	}
	if res.ByCode["accepted"] != k || res.ByCode["sold_out"] != users*rounds-k || len(res.ByCode) != 2 {
		t.Fatalf("by code %v", res.ByCode)
	}
	if len(res.Accepted) != k {
		t.Fatalf("accepted %d ids, want %d", len(res.Accepted), k)
	}
	for i, id := range res.Accepted {
		if id != uint64(1001+i) {
			t.Fatalf("accepted[%d] = %d, want %d (sorted, all of them)", i, id, 1001+i)
		}
	}
	if res.Latency.TotalCount() != users*rounds || res.AcceptedLatency.TotalCount() != k {
		t.Fatalf("latency counts %d/%d", res.Latency.TotalCount(), res.AcceptedLatency.TotalCount())
	}

	g.mu.Lock()
	defer g.mu.Unlock()
	// Every user clicked, equally often.
	if len(g.users) != users {
		t.Fatalf("%d distinct users, want %d", len(g.users), users)
	}
	for u, n := range g.users {
		if n != rounds {
			t.Fatalf("user %q sent %d requests, want %d", u, n, rounds)
		}
	}
	if len(g.idem) != users*rounds {
		t.Fatalf("%d distinct idempotency keys for %d requests", len(g.idem), users*rounds)
	}
	if g.paths["POST /v1/sales/s1/orders"] != users*rounds || len(g.paths) != 1 {
		t.Fatalf("paths %v", g.paths)
	}
	if g.body[`{"quantity":2,"region":"bj"}`] != users*rounds || len(g.body) != 1 {
		t.Fatalf("bodies %v", g.body)
	}

	final := strings.TrimSpace(progress.String())
	if !strings.HasPrefix(final, "bench: ") || !strings.HasSuffix(final, "req/s accepted 37 errors 0") ||
		!strings.Contains(final, " 200 req ") {
		t.Fatalf("final progress line %q", final)
	}

	var out bytes.Buffer
	res.Write(&out)
	for _, want := range []string{"requests   200 in", "202: 37  409: 163", "sold_out", "accepted   37 order ids", "p999"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRunDuration(t *testing.T) {
	g, target := startFake(t, 5, time.Millisecond)
	const d = 300 * time.Millisecond
	res, err := Run(context.Background(), Config{
		Target: target, Sale: "s1", Tokens: tokens(10), Concurrency: 4, Duration: d,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Elapsed < d || res.Elapsed > d+2*time.Second {
		t.Fatalf("elapsed %v for a %v run", res.Elapsed, d)
	}
	if res.Requests == 0 || res.Requests != g.n.Load() {
		t.Fatalf("requests %d, server saw %d", res.Requests, g.n.Load())
	}
	if len(res.Accepted) != 5 || res.ByStatus[202] != 5 {
		t.Fatalf("accepted %v, by status %v", res.Accepted, res.ByStatus)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.idem) != 0 {
		t.Fatalf("sent idempotency keys without being asked to")
	}
	if g.body[`{"quantity":1}`] == 0 || len(g.body) != 1 {
		t.Fatalf("bodies %v", g.body)
	}
}

// Requests stop the run before a long duration does, and the other way round.
func TestRunFirstStopWins(t *testing.T) {
	_, target := startFake(t, 0, 0)
	res, err := Run(context.Background(), Config{
		Target: target, Sale: "s1", Tokens: tokens(3), Concurrency: 8, Requests: 25, Duration: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 25 || res.ByCode["sold_out"] != 25 || len(res.Accepted) != 0 {
		t.Fatalf("requests %d, codes %v", res.Requests, res.ByCode)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	res, err = Run(ctx, Config{
		Target: target, Sale: "s1", Tokens: tokens(3), Concurrency: 8, Requests: 1 << 40,
	})
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 5*time.Second || res.Requests == 0 || res.Requests >= 1<<40 {
		t.Fatalf("canceled run: %d requests in %v", res.Requests, time.Since(start))
	}
}

func TestRunTransportErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	res, err := Run(context.Background(), Config{
		Target: "http://" + addr, Sale: "s1", Tokens: tokens(2), Concurrency: 2, Requests: 10,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 10 || res.Errors != 10 || len(res.ByStatus) != 0 || res.Latency.TotalCount() != 0 {
		t.Fatalf("requests %d errors %d status %v", res.Requests, res.Errors, res.ByStatus)
	}
}

func TestConfigErrors(t *testing.T) {
	ok := Config{Target: "http://127.0.0.1:1", Sale: "s", Tokens: tokens(1), Concurrency: 1, Requests: 1}
	for name, mutate := range map[string]func(*Config){
		"no target":    func(c *Config) { c.Target = "" },
		"bad scheme":   func(c *Config) { c.Target = "ftp://x" },
		"no host":      func(c *Config) { c.Target = "http://" },
		"no sale":      func(c *Config) { c.Sale = "" },
		"no tokens":    func(c *Config) { c.Tokens = nil },
		"no workers":   func(c *Config) { c.Concurrency = 0 },
		"no stop":      func(c *Config) { c.Requests = 0 },
		"negative qty": func(c *Config) { c.Quantity = -1 },
	} {
		c := ok
		mutate(&c)
		if _, err := Run(context.Background(), c); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestJSONString(t *testing.T) {
	body := []byte(`{"code":"accepted","order_id":"18446744073709551615","status":"pending"}`)
	if got := string(jsonString(body, keyCode)); got != "accepted" {
		t.Fatalf("code %q", got)
	}
	id, ok := parseUint(jsonString(body, keyOrderID))
	if !ok || id != 18446744073709551615 {
		t.Fatalf("order id %d %v", id, ok)
	}
	for _, bad := range []string{"", "18446744073709551616", "12a", "-1", "123456789012345678901"} {
		if _, ok := parseUint([]byte(bad)); ok {
			t.Errorf("parseUint(%q) ok", bad)
		}
	}
	if jsonString([]byte(`<html>502</html>`), keyCode) != nil || jsonString([]byte(`{"code":"x`), keyCode) != nil {
		t.Fatal("found a code where there is none")
	}
}

func TestRecordAllocs(t *testing.T) {
	w := newWorker(&histShard{lat: newHist(), accLat: newHist()})
	acc := []byte(`{"code":"accepted","order_id":"42","status":"pending"}`)
	sold := []byte(`{"code":"sold_out","message":"sold out"}`)
	w.record(202, acc, 10)
	w.record(409, sold, 10)
	w.ids = make([]uint64, 0, 1000)
	if n := testing.AllocsPerRun(100, func() {
		w.record(409, sold, 120)
		w.record(202, acc, 80)
	}); n != 0 {
		t.Fatalf("record allocates %v times per call", n)
	}
}
