package metrics

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/metrics/metricstest"
)

func value(t *testing.T, fs metricstest.Families, name string, pairs ...string) float64 {
	t.Helper()
	v, ok := fs.Value(name, pairs...)
	if !ok {
		t.Fatalf("no series %s%v", name, pairs)
	}
	return v
}

func TestGatewayScrape(t *testing.T) {
	m := NewGateway()
	for range 3 {
		m.Request(RoutePurchase, flashgate.CodeAccepted)
	}
	m.Request(RouteSale, CodeOK)
	m.Request(RoutePurchase, flashgate.CodeSoldOut)
	m.Request(RoutePurchase, "no_such_code")
	m.Request(Route(200), flashgate.CodeInvalidRequest)
	m.AdmitLatency(time.Millisecond)
	m.AdmitLatency(3 * time.Millisecond)
	m.PublishLatency(2 * time.Second)
	m.Refused(LimitIP)
	m.Refused(LimitIP)
	m.Refused(LimitConns)
	m.Refused(Limit(99)) // dropped
	m.InflightAdd(3)
	m.InflightAdd(-1)
	m.BreakerState("redis", BreakerOpen)
	m.BreakerState("nats", BreakerOpen)
	m.BreakerState("nats", BreakerClosed)
	m.SoldOutMarks(4)
	m.SoldOutMarked()
	m.SoldOutMarked()

	fs := metricstest.Handler(t, m.Handler())
	const req = "flashgate_gateway_requests_total"
	for _, c := range []struct {
		route, code string
		want        float64
	}{
		{"purchase", "accepted", 3},
		{"purchase", "sold_out", 1},
		{"purchase", "other", 1},
		{"sale", "ok", 1},
		{"other", "invalid_request", 1},
		{"order", "order_not_found", 0}, // created up front
		{"cancel", "other", 0},
	} {
		if got := value(t, fs, req, "route", c.route, "code", c.code); got != c.want {
			t.Errorf("%s{route=%q,code=%q} = %v, want %v", req, c.route, c.code, got, c.want)
		}
	}
	if got, want := fs.Series(req), int(numRoutes)*len(codes); got != want {
		t.Errorf("%s has %d series, want %d (every route × code up front)", req, got, want)
	}
	if got := value(t, fs, req); got != 7 {
		t.Errorf("%s sums to %v, want 7", req, got)
	}

	checks := []struct {
		name  string
		pairs []string
		want  float64
	}{
		{"flashgate_gateway_limiter_refusals_total", []string{"limit", "ip"}, 2},
		{"flashgate_gateway_limiter_refusals_total", []string{"limit", "conns"}, 1},
		{"flashgate_gateway_limiter_refusals_total", []string{"limit", "sale"}, 0},
		{"flashgate_gateway_limiter_refusals_total", nil, 3},
		{"flashgate_gateway_inflight", nil, 2},
		{"flashgate_gateway_breaker_state", []string{"breaker", "redis"}, 2},
		{"flashgate_gateway_breaker_state", []string{"breaker", "nats"}, 0},
		{"flashgate_gateway_soldout_marks", nil, 4},
		{"flashgate_gateway_soldout_marked_total", nil, 2},
	}
	for _, c := range checks {
		if got := value(t, fs, c.name, c.pairs...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.pairs, got, c.want)
		}
	}
	if n := fs.Series("flashgate_gateway_limiter_refusals_total"); n != int(numLimits) {
		t.Errorf("%d refusal series, want %d", n, numLimits)
	}

	if n, sum, ok := fs.Histogram("flashgate_gateway_admit_duration_seconds"); !ok || n != 2 || sum < 0.0039 || sum > 0.0041 {
		t.Errorf("admit histogram: count %d sum %v ok %v, want 2 and 0.004", n, sum, ok)
	}
	if n, sum, ok := fs.Histogram("flashgate_gateway_publish_duration_seconds"); !ok || n != 1 || sum != 2 {
		t.Errorf("publish histogram: count %d sum %v ok %v, want 1 and 2", n, sum, ok)
	}
	bs := fs["flashgate_gateway_admit_duration_seconds"].GetMetric()[0].GetHistogram().GetBucket()
	// The text format lists +Inf too.
	if len(bs) != len(latencyBuckets)+1 || bs[0].GetUpperBound() != 50e-6 || bs[len(bs)-2].GetUpperBound() != 5 {
		t.Errorf("buckets %v, want 50µs … 5s, +Inf", bs)
	}

	// The runtime, process and handler collectors come with the registry.
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total", "promhttp_metric_handler_requests_total"} {
		if _, ok := fs[name]; !ok {
			t.Errorf("no %s", name)
		}
	}
}

// TestRegistriesAreOwn: several gateways and backends live in one test
// process; none registers globally, none sees another's counts.
func TestRegistriesAreOwn(t *testing.T) {
	a, b := NewGateway(), NewGateway()
	_, _ = NewBackend(), NewBackend()
	a.Request(RoutePurchase, flashgate.CodeAccepted)
	fa := metricstest.Handler(t, a.Handler())
	fb := metricstest.Handler(t, b.Handler())
	if got := value(t, fa, "flashgate_gateway_requests_total", "route", "purchase", "code", "accepted"); got != 1 {
		t.Errorf("a: %v, want 1", got)
	}
	if got := value(t, fb, "flashgate_gateway_requests_total", "route", "purchase", "code", "accepted"); got != 0 {
		t.Errorf("b: %v, want 0", got)
	}
}

func TestBackendScrape(t *testing.T) {
	m := NewBackend()
	m.Batch(3, 10*time.Millisecond)
	m.Batch(500, 200*time.Millisecond)
	m.BatchFailed()
	m.Outcome(flashgate.OrderConfirmed, "")
	m.Outcome(flashgate.OrderConfirmed, "")
	m.Outcome(flashgate.OrderFailed, flashgate.ReasonSoldOut)
	m.Outcome(flashgate.OrderFailed, "unknown_region")
	m.Outcome(flashgate.OrderFailed, "cosmic_ray")
	m.Outcome("bogus", "x")
	m.Outcome(StatusDropped, "")
	m.Existing()
	m.Lag(7, 3)
	m.Lag(5, 2)
	m.Redelivered()
	m.MySQLError()
	m.MySQLError()

	fs := metricstest.Handler(t, m.Handler())
	const orders = "flashgate_backend_orders_total"
	checks := []struct {
		name  string
		pairs []string
		want  float64
	}{
		{orders, []string{"status", "confirmed"}, 2},
		{orders, []string{"status", "failed", "reason", "sold_out"}, 1},
		{orders, []string{"status", "failed", "reason", "unknown_region"}, 1},
		{orders, []string{"status", "failed", "reason", "other"}, 1},
		{orders, []string{"status", "failed", "reason", "limit_reached"}, 0}, // created up front
		{orders, []string{"status", "other", "reason", "other"}, 1},
		{orders, []string{"status", "dropped"}, 1},
		{orders, nil, 7},
		{"flashgate_backend_orders_existing_total", nil, 1},
		{"flashgate_backend_batches_failed_total", nil, 1},
		{"flashgate_backend_consumer_num_pending", nil, 5},
		{"flashgate_backend_consumer_num_ack_pending", nil, 2},
		{"flashgate_backend_redeliveries_total", nil, 1},
		{"flashgate_backend_mysql_errors_total", nil, 2},
	}
	for _, c := range checks {
		if got := value(t, fs, c.name, c.pairs...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.pairs, got, c.want)
		}
	}
	if n, sum, ok := fs.Histogram("flashgate_backend_batch_orders"); !ok || n != 2 || sum != 503 {
		t.Errorf("batch_orders: count %d sum %v ok %v, want 2 and 503", n, sum, ok)
	}
	if n, sum, ok := fs.Histogram("flashgate_backend_batch_duration_seconds"); !ok || n != 2 || sum < 0.2099 || sum > 0.2101 {
		t.Errorf("batch_duration: count %d sum %v ok %v, want 2 and 0.21", n, sum, ok)
	}
	if _, ok := fs["go_goroutines"]; !ok {
		t.Error("no go_goroutines")
	}
}

func TestNames(t *testing.T) {
	want := map[string]string{
		RouteSale.String(): "sale", RoutePurchase.String(): "purchase", RouteOrder.String(): "order",
		RoutePay.String(): "pay", RouteCancel.String(): "cancel", RoutePayment.String(): "payment", RouteOther.String(): "other", Route(77).String(): "other",
	}
	for got, w := range want {
		if got != w {
			t.Errorf("route %q, want %q", got, w)
		}
	}
	for l, w := range map[Limit]string{LimitIP: "ip", LimitUser: "user", LimitSale: "sale",
		LimitInflight: "inflight", LimitConns: "conns", Limit(9): "other"} {
		if l.String() != w {
			t.Errorf("limit %d = %q, want %q", l, l.String(), w)
		}
	}
}

// TestCodesCoverDomain reads flashgate.go: every Code constant the domain
// defines must have series of its own, not fall into "other".
func TestCodesCoverDomain(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "../flashgate.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for _, v := range vs.Values {
				lit, ok := v.(*ast.BasicLit)
				if !ok {
					continue
				}
				c, _ := strconv.Unquote(lit.Value)
				n++
				if i := codeIdx(flashgate.Code(c)); codes[i] != flashgate.Code(c) {
					t.Errorf("code %q of flashgate.go is not in metrics.codes: it would count as other", c)
				}
			}
		}
	}
	if n < 15 {
		t.Errorf("found only %d Code constants in flashgate.go", n)
	}
	for i, c := range codes {
		if codeIdx(c) != uint8(i) {
			t.Errorf("codeIdx(%q) = %d, want its place in codes, %d", c, codeIdx(c), i)
		}
	}
}

// TestHotPathAllocs: what the gateway calls per request allocates nothing.
func TestHotPathAllocs(t *testing.T) {
	m := NewGateway()
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"Request", func() { m.Request(RoutePurchase, flashgate.CodeAccepted) }},
		{"Request/unknown code", func() { m.Request(RoutePurchase, "brand_new") }},
		{"Request/bad route", func() { m.Request(Route(99), flashgate.CodeSoldOut) }},
		{"AdmitLatency", func() { m.AdmitLatency(137 * time.Microsecond) }},
		{"PublishLatency", func() { m.PublishLatency(2 * time.Millisecond) }},
		{"Refused", func() { m.Refused(LimitUser) }},
		{"InflightAdd", func() { m.InflightAdd(1); m.InflightAdd(-1) }},
	} {
		if n := testing.AllocsPerRun(1000, c.f); n != 0 {
			t.Errorf("%s: %v allocations per call, want 0", c.name, n)
		}
	}
}

// TestConcurrent hammers every method at once (run with -race).
func TestConcurrent(t *testing.T) {
	g, b := NewGateway(), NewBackend()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 500 {
				g.Request(Route(i%int(numRoutes)), codes[i%len(codes)])
				g.AdmitLatency(time.Duration(i) * time.Microsecond)
				g.PublishLatency(time.Duration(i) * time.Microsecond)
				g.Refused(Limit(i % int(numLimits)))
				g.InflightAdd(1)
				g.InflightAdd(-1)
				g.BreakerState("b"+strconv.Itoa(w%2), i%3)
				g.SoldOutMarks(i)
				g.SoldOutMarked()
				b.Batch(i, time.Millisecond)
				b.Outcome(flashgate.OrderFailed, "r"+strconv.Itoa(i%3))
				b.Outcome(flashgate.OrderConfirmed, "")
				b.Lag(uint64(i), i)
				b.Redelivered()
				b.MySQLError()
			}
		})
	}
	wg.Wait()
	fs := metricstest.Handler(t, g.Handler())
	if got := value(t, fs, "flashgate_gateway_requests_total"); got != 4000 {
		t.Errorf("requests %v, want 4000", got)
	}
	if got := value(t, fs, "flashgate_gateway_inflight"); got != 0 {
		t.Errorf("inflight %v, want 0", got)
	}
	fb := metricstest.Handler(t, b.Handler())
	if got := value(t, fb, "flashgate_backend_orders_total", "status", "failed", "reason", "other"); got != 4000 {
		t.Errorf("failed/other %v, want 4000", got)
	}
}

func TestPprofHandler(t *testing.T) {
	srv := httptest.NewServer(PprofHandler())
	defer srv.Close()
	for path, want := range map[string]string{
		"/debug/pprof/":                  "goroutine",
		"/debug/pprof/goroutine?debug=1": "goroutine profile",
		"/debug/pprof/cmdline":           "metrics.test",
		"/debug/pprof/heap?debug=1":      "heap profile",
		"/debug/pprof/profile?seconds=1": "", // a binary CPU profile
		"/debug/pprof/symbol":            "num_symbols",
		"/debug/pprof/trace?seconds=0.1": "",
	} {
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || !strings.Contains(string(body), want) || len(body) == 0 {
			t.Errorf("GET %s: %d, %d bytes, want 200 with %q", path, res.StatusCode, len(body), want)
		}
	}
}

func BenchmarkGatewayRequest(b *testing.B) {
	m := NewGateway()
	b.ReportAllocs()
	for b.Loop() {
		m.Request(RoutePurchase, flashgate.CodeSoldOut)
	}
}

func BenchmarkGatewayRequestParallel(b *testing.B) {
	m := NewGateway()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Request(RoutePurchase, flashgate.CodeAccepted)
		}
	})
}

func BenchmarkGatewayAdmitLatency(b *testing.B) {
	m := NewGateway()
	b.ReportAllocs()
	for b.Loop() {
		m.AdmitLatency(420 * time.Microsecond)
	}
}

func BenchmarkGatewayPublishLatency(b *testing.B) {
	m := NewGateway()
	b.ReportAllocs()
	for b.Loop() {
		m.PublishLatency(3 * time.Millisecond)
	}
}

func BenchmarkGatewayRefused(b *testing.B) {
	m := NewGateway()
	b.ReportAllocs()
	for b.Loop() {
		m.Refused(LimitIP)
	}
}

func BenchmarkGatewayInflightAdd(b *testing.B) {
	m := NewGateway()
	b.ReportAllocs()
	for b.Loop() {
		m.InflightAdd(1)
	}
}

func BenchmarkBackendOutcome(b *testing.B) {
	m := NewBackend()
	b.ReportAllocs()
	for b.Loop() {
		m.Outcome(flashgate.OrderFailed, flashgate.ReasonSoldOut)
	}
}
