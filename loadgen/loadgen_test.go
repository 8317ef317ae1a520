package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
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
		"no target":     func(c *Config) { c.Target = "" },
		"bad scheme":    func(c *Config) { c.Target = "ftp://x" },
		"no host":       func(c *Config) { c.Target = "http://" },
		"no sale":       func(c *Config) { c.Sale = "" },
		"no tokens":     func(c *Config) { c.Tokens = nil },
		"no workers":    func(c *Config) { c.Concurrency = 0 },
		"no stop":       func(c *Config) { c.Requests = 0 },
		"negative qty":  func(c *Config) { c.Quantity = -1 },
		"negative rate": func(c *Config) { c.Rate = -1 },
		"NaN rate":      func(c *Config) { c.Rate = math.NaN() },
		"endless rate":  func(c *Config) { c.Rate = math.Inf(1) },
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

// arrivals records when each request reached the server; stallAt > 0 makes
// the stallAt-th request hold every handler (a global lock) for stall, the
// way a GC pause, a full queue or a blocked event loop stalls a real server.
type arrivals struct {
	stallAt int64
	stall   time.Duration
	n       atomic.Int64
	gate    sync.Mutex

	mu sync.Mutex
	at []time.Time
}

func startArrivals(t *testing.T, a *arrivals) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		now := time.Now()
		n := a.n.Add(1)
		a.mu.Lock()
		a.at = append(a.at, now)
		a.mu.Unlock()
		a.gate.Lock()
		if n == a.stallAt {
			time.Sleep(a.stall)
		}
		a.gate.Unlock()
		ctx.SetStatusCode(fasthttp.StatusConflict)
		ctx.SetBodyString(`{"code":"sold_out","message":"sold out"}`)
	}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Shutdown()
		<-done
	})
	return "http://" + ln.Addr().String()
}

// A paced run sends at the rate asked, spread over the run, not in a burst.
func TestRunRate(t *testing.T) {
	a := &arrivals{}
	target := startArrivals(t, a)
	const rate, n = 2000.0, 1000
	before := time.Now()
	res, err := Run(context.Background(), Config{
		Target: target, Sale: "s1", Tokens: tokens(10), Concurrency: 16, Requests: n, Rate: rate,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != n || res.Errors != 0 || res.ByStatus[409] != n {
		t.Fatalf("requests %d errors %d status %v", res.Requests, res.Errors, res.ByStatus)
	}
	// The last request is due at (n-1)/rate: the run cannot be shorter.
	if min := time.Duration(float64(n-1) / rate * float64(time.Second)); res.Elapsed < min {
		t.Fatalf("elapsed %v, shorter than the schedule's %v", res.Elapsed, min)
	}
	t.Logf("achieved %.0f req/s for %.0f; latency p50 %dµs p99 %dµs; send lag p50 %dµs p99 %dµs max %dµs",
		res.Throughput(), rate, res.Latency.ValueAtQuantile(50), res.Latency.ValueAtQuantile(99),
		res.SendLag.ValueAtQuantile(50), res.SendLag.ValueAtQuantile(99), res.SendLag.Max())
	// A generous band below (a busy machine makes the generator late, and
	// the run longer); none above.
	if got := res.Throughput(); got < 0.5*rate || got > 1.01*rate {
		t.Fatalf("achieved %.0f req/s for %.0f asked", got, rate)
	}
	if res.Rate != rate || res.SendLag == nil || res.SendLag.TotalCount() != n || res.Latency.TotalCount() != n {
		t.Fatalf("rate %v, send lag %v, latency count %d", res.Rate, res.SendLag, res.Latency.TotalCount())
	}
	// Never ahead of the timeline: the k-th request to reach the server left
	// no earlier than request k was due (a closed loop would have sent them
	// all within a few milliseconds). Late is possible, early is not.
	a.mu.Lock()
	defer a.mu.Unlock()
	slices.SortFunc(a.at, func(x, y time.Time) int { return x.Compare(y) })
	for k, at := range a.at {
		if due := before.Add(time.Duration(float64(k) / rate * float64(time.Second))); at.Before(due) {
			t.Fatalf("request %d arrived %v ahead of its due time", k, due.Sub(at))
		}
	}

	var out bytes.Buffer
	res.Write(&out)
	for _, want := range []string{"asked 2000 req/s", "send lag"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// With a rate, a duration is a number of requests, all of them sent.
func TestRunRateDuration(t *testing.T) {
	target := startArrivals(t, &arrivals{})
	res, err := Run(context.Background(), Config{
		Target: target, Sale: "s1", Tokens: tokens(3), Concurrency: 4, Rate: 400, Duration: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 200 || res.Latency.TotalCount() != 200 {
		t.Fatalf("requests %d (latencies %d), want 400/s × 0.5 s = 200", res.Requests, res.Latency.TotalCount())
	}
	if res.Elapsed < 495*time.Millisecond || res.Elapsed > 3*time.Second {
		t.Fatalf("elapsed %v for a 500ms schedule", res.Elapsed)
	}
	// Requests is a cap on Rate × Duration.
	res, err = Run(context.Background(), Config{
		Target: target, Sale: "s1", Tokens: tokens(3), Concurrency: 4, Rate: 400, Duration: time.Hour, Requests: 20,
	})
	if err != nil || res.Requests != 20 {
		t.Fatalf("requests %d, %v; want 20", res.Requests, err)
	}
}

// A server that stalls once shows the stall in a paced run's histogram for
// every request that was due during it, not only for the few in flight: the
// latency runs from the due time (wrk2's correction of coordinated omission).
// The same stall under a closed loop reaches at most one request per worker.
func TestRunRateMeasuresFromSchedule(t *testing.T) {
	const (
		rate    = 1000.0
		n       = 800
		workers = 8
		stall   = 300 * time.Millisecond
		slow    = 100 * time.Millisecond
	)
	a := &arrivals{stallAt: 200, stall: stall}
	target := startArrivals(t, a)
	res, err := Run(context.Background(), Config{
		Target: target, Sale: "s1", Tokens: tokens(10), Concurrency: workers, Requests: n, Rate: rate,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != n || res.Latency.TotalCount() != n {
		t.Fatalf("requests %d, latencies %d", res.Requests, res.Latency.TotalCount())
	}
	// Requests due in the first 200 ms of the 300 ms stall waited at least
	// 100 ms: about 200 of them.
	over := n - countBelow(res.Latency.Distribution(), slow)
	t.Logf("paced: %d of %d over %v, p50 %dµs p99 %dµs max %dµs, send lag max %dµs", over, n, slow,
		res.Latency.ValueAtQuantile(50), res.Latency.ValueAtQuantile(99), res.Latency.Max(), res.SendLag.Max())
	if over < 100 {
		t.Fatalf("%d of %d requests took over %v through a %v stall at %.0f/s; want about %d",
			over, n, slow, stall, rate, int(rate*(stall-slow).Seconds()))
	}
	if p := res.Latency.ValueAtQuantile(99); p < (stall - 50*time.Millisecond).Microseconds() {
		t.Fatalf("p99 %dµs: the stall does not show", p)
	}
	if lag := res.SendLag.Max(); lag < slow.Microseconds() {
		t.Fatalf("send lag max %dµs: the queued requests left late, it should say so", lag)
	}

	// Closed loop, same stall: only the requests in flight see it (one per
	// worker; a little slack for a machine that stalls the client too).
	a2 := &arrivals{stallAt: 200, stall: stall}
	target = startArrivals(t, a2)
	res, err = Run(context.Background(), Config{
		Target: target, Sale: "s1", Tokens: tokens(10), Concurrency: workers, Requests: n,
	})
	if err != nil {
		t.Fatal(err)
	}
	over = n - countBelow(res.Latency.Distribution(), slow)
	t.Logf("closed loop: %d of %d over %v, p50 %dµs p99 %dµs max %dµs", over, n, slow,
		res.Latency.ValueAtQuantile(50), res.Latency.ValueAtQuantile(99), res.Latency.Max())
	if over > 3*workers {
		t.Fatalf("closed loop: %d requests over %v with %d workers", over, slow, workers)
	}
}

// countBelow counts the recorded values under d.
func countBelow(bars []hdrhistogram.Bar, d time.Duration) int {
	n := 0
	for _, b := range bars {
		if b.To < d.Microseconds() {
			n += int(b.Count)
		}
	}
	return n
}

// A paced run waiting for its next due time stops at once when canceled.
func TestRunRateCanceled(t *testing.T) {
	target := startArrivals(t, &arrivals{})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	res, err := Run(ctx, Config{
		Target: target, Sale: "s1", Tokens: tokens(3), Concurrency: 4, Rate: 2, Requests: 100,
	})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second || res.Requests != 1 {
		t.Fatalf("canceled after %v with %d requests; want 1 (only request 0 is due before 500ms)", d, res.Requests)
	}
}

// The pacer's timeline holds: tokens come no earlier than due and, on an idle
// machine, soon after; nothing on the way allocates.
func TestPacer(t *testing.T) {
	const n = 200
	r := &run{interval: float64(200 * time.Microsecond), limit: n, due: make(chan struct{}, n)}
	r.start = time.Now()
	go r.pace()
	var late []time.Duration
	for i := int64(0); ; i++ {
		if _, ok := <-r.due; !ok {
			if i != n {
				t.Fatalf("%d tokens, want %d", i, n)
			}
			break
		}
		l := time.Since(r.dueAt(i))
		if l < 0 {
			t.Fatalf("token %d came %v early", i, -l)
		}
		late = append(late, l)
	}
	slices.Sort(late)
	t.Logf("token lateness p50 %v p90 %v max %v", late[n/2], late[n*9/10], late[n-1])

	w := newWorker(&histShard{lat: newHist(), accLat: newHist(), lag: newHist()})
	if a := testing.AllocsPerRun(100, func() {
		nap(time.Microsecond)
		w.recordLag(time.Since(r.dueAt(3)).Microseconds())
		w.recordLag(-3) // clamped
	}); a != 0 {
		t.Fatalf("pacing allocates %v times per request", a)
	}
	if w.hist.lag.TotalCount() != 2*(100+1) {
		t.Fatalf("lag count %d", w.hist.lag.TotalCount())
	}
}

func TestSummary(t *testing.T) {
	target := startArrivals(t, &arrivals{})
	res, err := Run(context.Background(), Config{
		Target: target, Sale: "s1", Tokens: tokens(3), Concurrency: 2, Requests: 50, Rate: 1000,
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(res.Summary())
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got["requests"] != 50.0 || got["rate"] != 1000.0 || got["latency_from"] != "due" ||
		got["by_status"].(map[string]any)["409"] != 50.0 || got["by_code"].(map[string]any)["sold_out"] != 50.0 {
		t.Fatalf("summary %s", b)
	}
	lat := got["latency_us"].(map[string]any)
	if lat["count"] != 50.0 || lat["p99"].(float64) < lat["p50"].(float64) || lat["max"].(float64) < lat["p999"].(float64) {
		t.Fatalf("latency %v", lat)
	}
	if _, ok := got["send_lag_us"]; !ok {
		t.Fatalf("no send lag in %s", b)
	}
	res.Rate, res.SendLag = 0, nil
	if s := res.Summary(); s.LatencyFrom != "sent" || s.SendLag != nil {
		t.Fatalf("unpaced summary %+v", s)
	}
}

// A recorded run keeps every request: who sent it (the token's index), its
// key, and its answer, the 202s with their order ids.
func TestRecordKeepsEveryCall(t *testing.T) {
	g, url := startFake(t, 5, 0)
	toks := tokens(4)
	res, err := Run(context.Background(), Config{Target: url, Sale: "s", Tokens: toks, Concurrency: 3, Requests: 12,
		Idempotency: true, Record: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Calls) != 12 {
		t.Fatalf("%d calls recorded of 12", len(res.Calls))
	}
	perUser := map[int]int{}
	keys := map[string]bool{}
	var ids []uint64
	for _, c := range res.Calls {
		perUser[c.User]++
		keys[c.Key] = true
		if c.Answered.Before(c.Sent) {
			t.Errorf("call answered before it was sent: %+v", c)
		}
		switch c.Status {
		case 202:
			ids = append(ids, c.Order)
		case 409:
			if c.Code != "sold_out" || c.Order != 0 {
				t.Errorf("a 409 recorded as %+v", c)
			}
		default:
			t.Errorf("status %d", c.Status)
		}
	}
	slices.Sort(ids)
	if !slices.Equal(ids, res.Accepted) {
		t.Errorf("recorded 202s %v, accepted %v", ids, res.Accepted)
	}
	if len(keys) != 12 {
		t.Errorf("%d distinct keys recorded, want 12", len(keys))
	}
	// Each user is asked for in turn: 3 requests each, and the fake saw the
	// same users under their tokens.
	for u, n := range perUser {
		if n != 3 || g.users[string(toks[u])] != 3 {
			t.Errorf("user %d: %d recorded, %d seen by the server", u, n, g.users[string(toks[u])])
		}
	}
}
