package e2e

// What an operator watches (docs/observability.md): the per-sale gauges and
// the conservation error, the request id from nginx to the backend's log, the
// Grafana dashboard's metrics, the Prometheus rules, and the live view.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/loadgen"
	"github.com/flashgate/flashgate/lua"
)

// postOrder buys one unit of sale as token, with requestID as X-Request-Id
// ("" sends none), and answers the status and body.
func postOrder(t *testing.T, addr, sale string, token []byte, requestID string) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/sales/"+sale+"/orders", strings.NewReader(`{"quantity":1}`))
	req.Header.Set("Authorization", string(token))
	req.Header.Set("Content-Type", "application/json")
	if requestID != "" {
		req.Header.Set("X-Request-Id", requestID)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("purchase: %v", err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, body
}

// scrape reads a /metrics page: every sample's name and labels → value.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer res.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, _ := strconv.ParseFloat(line[i+1:], 64)
		out[line[:i]] = v
	}
	return out
}

// names are the metric names of a scrape.
func names(samples map[string]float64) map[string]bool {
	out := map[string]bool{}
	for k := range samples {
		if i := strings.IndexByte(k, '{'); i >= 0 {
			k = k[:i]
		}
		out[k] = true
	}
	return out
}

// gauge waits until the sample series has the value want, and fails with the
// last value seen after 30 s (the leader sets the gauges every second).
func awaitGauge(t *testing.T, addr, series string, want float64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var got float64
	var ok bool
	for time.Now().Before(deadline) {
		got, ok = scrape(t, addr)[series]
		if ok && got == want {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s = %v (present %t), want %v", series, got, ok, want)
}

func adminPost(t *testing.T, cfg config.Config, addr, path string) []byte {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+addr+path, nil)
	req.Header.Set("Authorization", "Bearer "+cfg.Admin.Token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 {
		t.Fatalf("POST %s: %d %s", path, res.StatusCode, b)
	}
	return b
}

// TestConservationGauge: the leader's conservation gauge is 0 once a sale has
// sold and settled, non-zero when the books are broken on purpose (units
// taken from the Redis stock behind everyone's back), and 0 again after a
// reconcile; `sale show`'s view says the same.
func TestConservationGauge(t *testing.T) {
	cfg := e2eConfig(t)
	be := startBackend(t, cfg)
	gw := startGateway(t, cfg)
	s := newSale(10, 1)
	createSale(t, cfg, be.AdminAddr(), s)
	awaitSale(t, gw, s.ID)
	toks := tokens(t, cfg, "cons", 4)
	var accepted []uint64
	for _, tok := range toks {
		code, _, body := postOrder(t, gw.Addr(), s.ID, tok, "")
		if code != 202 {
			t.Fatalf("purchase: %d %s", code, body)
		}
		var a struct {
			OrderID string `json:"order_id"`
		}
		_ = json.Unmarshal(body, &a)
		id, _ := strconv.ParseUint(a.OrderID, 10, 64)
		accepted = append(accepted, id)
	}
	assertInvariants(t, drain(t, cfg, s.ID, accepted))

	sel := `{sale="` + s.ID + `"}`
	awaitGauge(t, be.AdminAddr(), "flashgate_sale_sold_units"+sel, 4)
	awaitGauge(t, be.AdminAddr(), "flashgate_sale_remaining_units"+sel, 6)
	awaitGauge(t, be.AdminAddr(), "flashgate_sale_pending_orders"+sel, 0)
	awaitGauge(t, be.AdminAddr(), "flashgate_sale_conservation_error_units"+sel, 0)
	awaitGauge(t, be.AdminAddr(), "flashgate_backend_leader", 1)

	// Break the books: three units vanish from the stock key.
	rc := testenv.Redis(t, cfg.Redis.Addrs)
	_, stock := lua.KeysFor(s.ID, nil).StockKeys()
	if err := rc.Do(context.Background(), rc.B().Decrby().Key(stock[0]).Decrement(3).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	awaitGauge(t, be.AdminAddr(), "flashgate_sale_conservation_error_units"+sel, -3)
	if v := saleShow(t, cfg, be.AdminAddr(), s.ID); v != -3 {
		t.Fatalf("sale show: conservation_error_units %d, want -3", v)
	}

	adminPost(t, cfg, be.AdminAddr(), "/admin/v1/sales/"+s.ID+"/reconcile")
	awaitGauge(t, be.AdminAddr(), "flashgate_sale_conservation_error_units"+sel, 0)
	awaitGauge(t, be.AdminAddr(), "flashgate_sale_remaining_units"+sel, 6)
	if v := saleShow(t, cfg, be.AdminAddr(), s.ID); v != 0 {
		t.Fatalf("sale show after reconcile: conservation_error_units %d, want 0", v)
	}
	if n := scrape(t, be.AdminAddr())[`flashgate_backend_reconciles_total{result="ok"}`]; n < 1 {
		t.Fatalf("reconciles_total{ok} = %v after a reconcile", n)
	}
}

// saleShow is the conservation error GET /admin/v1/sales/{sale} (`flashgate
// sale show`) reports.
func saleShow(t *testing.T, cfg config.Config, addr, id string) int64 {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+"/admin/v1/sales/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+cfg.Admin.Token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var v struct {
		C *int64 `json:"conservation_error_units"`
	}
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil || v.C == nil {
		t.Fatalf("sale show: %v (conservation_error_units missing?)", err)
	}
	return *v.C
}

// lockedBuffer collects log output written from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRequestIDReachesBackendLog: the X-Request-Id of a purchase (nginx's
// $request_id) is in the backend's log line for that order, having travelled
// in the JetStream message's header; a purchase without one gets one the
// gateway made, echoed in its 202.
func TestRequestIDReachesBackendLog(t *testing.T) {
	logs := &lockedBuffer{}
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewJSONHandler(logs, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	cfg := e2eConfig(t)
	cfg.Gateway.AccessLogSample = 1
	be := startBackend(t, cfg)
	gw := startGateway(t, cfg)
	s := newSale(5, 1)
	createSale(t, cfg, be.AdminAddr(), s)
	awaitSale(t, gw, s.ID)
	toks := tokens(t, cfg, "rid", 2)

	const rid = "0123456789abcdef0123456789abcdef"
	code, hdr, body := postOrder(t, gw.Addr(), s.ID, toks[0], rid)
	if code != 202 || hdr.Get("X-Request-Id") != rid {
		t.Fatalf("purchase: %d %s, X-Request-Id %q", code, body, hdr.Get("X-Request-Id"))
	}
	var a struct {
		OrderID string `json:"order_id"`
	}
	_ = json.Unmarshal(body, &a)
	code, hdr, body = postOrder(t, gw.Addr(), s.ID, toks[1], "")
	made := hdr.Get("X-Request-Id")
	if code != 202 || !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(made) {
		t.Fatalf("purchase without an id: %d %s, X-Request-Id %q", code, body, made)
	}

	// lines are the JSON log lines so far; has reports whether m holds want.
	lines := func() []map[string]any {
		var out []map[string]any
		for line := range strings.Lines(logs.String()) {
			var m map[string]any
			dec := json.NewDecoder(strings.NewReader(line))
			dec.UseNumber() // order ids are past float64's integers
			if dec.Decode(&m) == nil {
				out = append(out, m)
			}
		}
		return out
	}
	has := func(m map[string]any, want map[string]string) bool {
		for k, v := range want {
			if fmt.Sprint(m[k]) != v {
				return false
			}
		}
		return true
	}
	// written finds the backend's "orders written" line naming an order with want.
	written := func(want map[string]string) bool {
		for _, m := range lines() {
			if m["msg"] != "orders written" {
				continue
			}
			orders, _ := m["orders"].([]any)
			for _, o := range orders {
				if om, ok := o.(map[string]any); ok && has(om, want) {
					return true
				}
			}
		}
		return false
	}
	deadline := time.Now().Add(30 * time.Second)
	for !written(map[string]string{"order": a.OrderID, "request_id": rid, "status": "confirmed"}) ||
		!written(map[string]string{"request_id": made, "status": "confirmed"}) {
		if time.Now().After(deadline) {
			t.Fatalf("no backend log line for order %s with request_id %s (and one with %s):\n%s", a.OrderID, rid, made, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	find := func(want map[string]string) bool {
		for _, m := range lines() {
			if has(m, want) {
				return true
			}
		}
		return false
	}
	// access_log_sample 1: every request has its access line, with the same id.
	if !find(map[string]string{"msg": "access", "request_id": rid, "route": "purchase", "status": "202", "code": "accepted"}) {
		t.Fatalf("no access log line for request %s:\n%s", rid, logs.String())
	}
}

// TestPrometheusRules runs promtool over deploy/prometheus: the rules parse
// (check rules) and each alert fires when it should and not when it should
// not (test rules).
func TestPrometheusRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: install Debian's prometheus package (scripts/stack.sh deps)")
	}
	dir := filepath.Join("..", "deploy", "prometheus")
	out, err := exec.Command(promtool, "check", "rules", filepath.Join(dir, "flashgate.rules.yml")).CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("SUCCESS")) {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	out, err = exec.Command(promtool, "test", "rules", filepath.Join(dir, "flashgate.rules.test.yml")).CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("SUCCESS")) {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	// Every alert is tested, and every alert names its runbook section.
	rules, _ := os.ReadFile(filepath.Join(dir, "flashgate.rules.yml"))
	tests, _ := os.ReadFile(filepath.Join(dir, "flashgate.rules.test.yml"))
	alerts := regexp.MustCompile(`(?m)^\s+- alert: (\w+)$`).FindAllStringSubmatch(string(rules), -1)
	if len(alerts) < 9 {
		t.Fatalf("%d alerts in flashgate.rules.yml", len(alerts))
	}
	for _, a := range alerts {
		if !bytes.Contains(tests, []byte("alertname: "+a[1])) {
			t.Errorf("alert %s has no promtool test", a[1])
		}
		if !bytes.Contains(rules, []byte("runbook_url: docs/runbook.md#"+strings.ToLower(a[1]))) {
			t.Errorf("alert %s has no runbook_url docs/runbook.md#%s", a[1], strings.ToLower(a[1]))
		}
	}
	cases := bytes.Count(tests, []byte("alertname: ")) + bytes.Count(tests, []byte("- expr: "))
	t.Logf("promtool: %d rules checked, %d test cases passed", bytes.Count(rules, []byte("- alert: "))+bytes.Count(rules, []byte("- record: ")), cases)
}

// TestDashboardMetricsExist: every metric the Grafana dashboard queries is on
// a live gateway's or backend's /metrics once a purchase has gone through.
func TestDashboardMetricsExist(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "deploy", "grafana", "flashgate.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	var exprs []string
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if v.Definition != "" {
			exprs = append(exprs, v.Definition)
		}
	}

	cfg := e2eConfig(t)
	be := startBackend(t, cfg)
	gw := startGateway(t, cfg)
	s := newSale(5, 1)
	createSale(t, cfg, be.AdminAddr(), s)
	awaitSale(t, gw, s.ID)
	if code, _, body := postOrder(t, gw.Addr(), s.ID, tokens(t, cfg, "dash", 1)[0], ""); code != 202 {
		t.Fatalf("purchase: %d %s", code, body)
	}
	awaitGauge(t, be.AdminAddr(), `flashgate_sale_sold_units{sale="`+s.ID+`"}`, 1)
	have := names(scrape(t, gw.AdminAddr()))
	for n := range names(scrape(t, be.AdminAddr())) {
		have[n] = true
	}

	metric := regexp.MustCompile(`flashgate_[a-z0-9_]+`)
	checked := map[string]bool{}
	for _, e := range exprs {
		found := metric.FindAllString(e, -1)
		if len(found) == 0 {
			t.Errorf("query %q uses no flashgate metric", e)
		}
		for _, n := range found {
			checked[n] = true
			if !have[n] {
				t.Errorf("query %q: metric %s is on neither /metrics", e, n)
			}
		}
	}
	if len(checked) < 20 {
		t.Fatalf("only %d metrics checked", len(checked))
	}
	t.Logf("%d panels' queries use %d metrics, all live", len(exprs), len(checked))
}

// TestLiveView opens the backend's /ui/ in headless Chromium during a flood
// (loadgen, paced, a quarter of the requests from buyers who already bought)
// and checks that the page draws the sale: after logging in with the admin
// token, each chart of the sale is a uPlot instance whose canvas holds its
// lines' colours, the traffic series grow a point a second without a reload,
// the limits table lists the sale's limits and the gateway's rate limits, and
// the sale-day buttons are those live.json's role allows; reconcile, clicked,
// reaches the admin API. The vendored uPlot, the page's script and its
// stylesheet are behind the token. With FLASHGATE_SCREENSHOT set it writes the
// page, mid-flood, to docs/live-view.png.
func TestLiveView(t *testing.T) {
	const chromium = "/usr/bin/chromium"
	if _, err := os.Stat(chromium); err != nil {
		t.Fatal("chromium not found: install Debian's chromium package (scripts/stack.sh deps)")
	}
	cfg := e2eConfig(t)
	// Rate limits the flood stays under, for the table to show.
	cfg.RateLimit = config.RateLimit{PerIP: config.Rate{Rate: 50, Burst: 100}, PerUser: config.Rate{Rate: 5, Burst: 10},
		PerSale: config.Rate{Rate: 5000, Burst: 5000}, MaxInflight: 2000}
	be := startBackend(t, cfg)
	gw := startGateway(t, cfg)
	s := newSale(5000, 1)
	s.Title = "flash sale"
	s.Limits = []flashgate.Limit{{Dimension: flashgate.DimIP, Max: 2, Per: flashgate.PerDay}}
	createSale(t, cfg, be.AdminAddr(), s)
	awaitSale(t, gw, s.ID)

	// Unauthenticated: neither the numbers nor the page's files.
	for _, path := range []string{"/ui/live.json", "/ui/vendor/uplot/uPlot.iife.min.js"} {
		res, err := http.Get("http://" + be.AdminAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s without the token: %d", path, res.StatusCode)
		}
	}
	for path, ctype := range map[string]string{"/ui/vendor/uplot/uPlot.iife.min.js": "text/javascript", "/ui/vendor/uplot/uPlot.min.css": "text/css"} {
		req, _ := http.NewRequest("GET", "http://"+be.AdminAddr()+path, nil)
		req.Header.Set("Authorization", "Bearer "+cfg.Admin.Token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), ctype) || len(b) < 1000 {
			t.Fatalf("%s: %d %q, %d bytes", path, res.StatusCode, res.Header.Get("Content-Type"), len(b))
		}
	}

	// The flood: 60 purchases a second from buyers with addresses of their
	// own (X-Forwarded-For), one in four from a buyer who already bought
	// (limit_reached), until the test ends.
	toks := tokens(t, cfg, "live", 3000)
	users := make([][]byte, len(toks))
	for i := range users {
		users[i] = toks[i]
		if i%4 == 3 {
			users[i] = toks[i-3]
		}
	}
	flood, stopFlood := context.WithCancel(context.Background())
	var floodRes *loadgen.Result
	var floodErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		floodRes, floodErr = loadgen.Run(flood, loadgen.Config{Target: "http://" + gw.Addr(), Sale: s.ID, Tokens: users,
			Concurrency: 8, Rate: 60, Duration: 10 * time.Minute, ClientIPs: true})
	})
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			stopFlood()
			wg.Wait()
		}
	}
	t.Cleanup(stop)

	profile, err := os.MkdirTemp("", "flashgate-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The browser (killed when the allocator's context ends) and its
		// helpers may outlive the test by a moment: retry for up to 5 s.
		for range 50 {
			if os.RemoveAll(profile) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	opts := append([]chromedp.ExecAllocatorOption{}, chromedp.DefaultExecAllocatorOptions[:]...)
	opts = append(opts, chromedp.ExecPath(chromium), chromedp.Flag("headless", true), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.NoFirstRun, chromedp.UserDataDir(profile), chromedp.WindowSize(1280, 900))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelA()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancelT := context.WithTimeout(bctx, 4*time.Minute)
	defer cancelT()

	card := `.sale[data-sale="` + s.ID + `"]`
	if err := chromedp.Run(ctx,
		chromedp.Navigate("http://"+be.AdminAddr()+"/ui/"),
		chromedp.WaitVisible(`#token`, chromedp.ByQuery),
		chromedp.SendKeys(`#token`, cfg.Admin.Token, chromedp.ByQuery),
		chromedp.Click(`#login`, chromedp.ByQuery),
		chromedp.WaitVisible(card+` [data-f="sold"]`, chromedp.ByQuery),
	); err != nil {
		t.Fatalf("live view: %v", err)
	}

	// The charting library loaded (the page loads it before its own script,
	// which drew the card).
	var lib string
	if err := chromedp.Run(ctx, chromedp.Evaluate(`typeof window.uPlot`, &lib)); err != nil || lib != "function" {
		t.Fatalf("uPlot did not load (typeof uPlot %q, %v): the vendored script is missing or broken", lib, err)
	}

	// chartState is what the page's uPlot instances of the sale hold.
	type chartState struct {
		Series []string `json:"series"`
		First  float64  `json:"first"`
		Last   float64  `json:"last"`
		Points []int    `json:"points"` // non-null values per line
	}
	charts := func() map[string]chartState {
		t.Helper()
		var out map[string]chartState
		if err := chromedp.Run(ctx, chromedp.Evaluate(`window.flashgateLive ? window.flashgateLive.charts(`+strconv.Quote(s.ID)+`) : null`, &out)); err != nil {
			t.Fatalf("reading the charts: %v", err)
		}
		return out
	}
	// awaitCharts waits until every chart is drawn and the traffic one has
	// at least n seconds of requests and admissions.
	awaitCharts := func(n int) map[string]chartState {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			c := charts()
			tr, ok := c["traffic"]
			if len(c) == 4 && ok && len(tr.Points) >= 2 && tr.Points[0] >= n && tr.Points[1] >= n {
				return c
			}
			if time.Now().After(deadline) {
				var html string
				_ = chromedp.Run(ctx, chromedp.OuterHTML(card, &html, chromedp.ByQuery))
				t.Fatalf("the charts of the sale were not drawn with %d points: %+v\n%s", n, c, html)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	first := awaitCharts(10)
	for name, want := range map[string][]string{"traffic": {"requests", "admissions (202)"}, "stock": {"sold", "remaining"},
		"p99": {"p99 ms"}, "backlog": {"orders"}} {
		got := first[name].Series
		if len(got) < len(want) || !slices.Equal(got[:len(want)], want) {
			t.Errorf("chart %s draws %v, want %v first", name, got, want)
		}
	}
	if !slices.Contains(first["traffic"].Series, "limit_reached") {
		t.Errorf("the traffic chart has no limit_reached line: %v", first["traffic"].Series)
	}
	// The series advance: three more seconds, no reload.
	var later map[string]chartState
	deadline := time.Now().Add(time.Minute)
	for {
		later = charts()
		if tr := later["traffic"]; tr.Last >= first["traffic"].Last+3 && len(tr.Points) > 0 && tr.Points[0] > first["traffic"].Points[0] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the traffic series did not advance: %+v then %+v", first["traffic"], later["traffic"])
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, name := range []string{"stock", "p99"} {
		if later[name].Points[0] == 0 {
			t.Errorf("chart %s has no point: %+v", name, later[name])
		}
	}

	// Each chart's canvas holds the colour of its first line (live.js's
	// COLOR), not only axes: the lines were drawn.
	var pixels map[string]int
	if err := chromedp.Run(ctx, chromedp.Evaluate(`(() => {
		const want = {traffic: [91, 107, 130], stock: [26, 152, 80], p99: [142, 68, 173]};
		const out = {};
		for (const [name, rgb] of Object.entries(want)) {
			const cv = document.querySelector(`+strconv.Quote(card)+` + ' [data-chart="' + name + '"] canvas');
			if (!cv) { out[name] = -1; continue; }
			const d = cv.getContext("2d").getImageData(0, 0, cv.width, cv.height).data;
			let n = 0;
			for (let i = 0; i < d.length; i += 4) {
				if (d[i+3] > 128 && Math.abs(d[i]-rgb[0]) + Math.abs(d[i+1]-rgb[1]) + Math.abs(d[i+2]-rgb[2]) < 60) n++;
			}
			out[name] = n;
		}
		return out;
	})()`, &pixels)); err != nil {
		t.Fatal(err)
	}
	for name, n := range pixels {
		if n < 20 {
			t.Errorf("chart %s: %d pixels of its line's colour on its canvas: not drawn", name, n)
		}
	}

	// The limits in force, as tables: the sale's and the gateway's.
	var limits, gwLimits string
	if err := chromedp.Run(ctx,
		chromedp.Text(card+` [data-f="limits"]`, &limits, chromedp.ByQuery),
		chromedp.Text(`#gwlimits`, &gwLimits, chromedp.ByQuery),
	); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"stock\t5000 units", "per user\t1 unit\t", "per order\t1 unit\t", "per ip\t2 units\ta day (UTC)"} {
		if !strings.Contains(limits, want) {
			t.Errorf("the limits table lacks %q:\n%s", want, limits)
		}
	}
	for _, want := range []string{"50/s, burst 100", "5/s, burst 10", "5000/s, burst 5000", "2000"} {
		if !strings.Contains(gwLimits, want) {
			t.Errorf("the gateways' limits table lacks %q:\n%s", want, gwLimits)
		}
	}

	if os.Getenv("FLASHGATE_SCREENSHOT") != "" {
		awaitCharts(45) // the picture of a minute of the flood
		var png []byte
		if err := chromedp.Run(ctx, chromedp.FullScreenshot(&png, 100)); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join("..", "docs", "live-view.png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The sale-day buttons are those live.json's role allows: live.json as
	// served, then with each role, drawn at once (before the next poll).
	var byRole map[string][]string
	if err := chromedp.Run(ctx,
		chromedp.Evaluate(`fetch("live.json").then(r => r.json()).then(v => {
			const buttons = () => [...document.querySelectorAll(`+strconv.Quote(card+` .actions button`)+`)].map(b => b.dataset.action);
			const out = {};
			out["served:" + (v.role === undefined ? "" : v.role)] = buttons();
			for (const role of ["viewer", "operator", "", "admin"]) {
				window.flashgateLive.draw(Object.assign({}, v, {role}));
				out[role] = buttons();
			}
			window.flashgateLive.draw(v);
			return out;
		})`, &byRole, func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) }),
	); err != nil {
		t.Fatal(err)
	}
	// The admin token logged in: an operator's session.
	all := []string{"pause", "resume", "reconcile", "close"}
	for role, want := range map[string][]string{"viewer": {}, "operator": all, "": {}, "admin": {}, "served:operator": all} {
		if got, ok := byRole[role]; !ok || !slices.Equal(got, want) {
			t.Errorf("role %q: buttons %v, want %v (all: %v)", role, got, want, byRole)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// Reconcile, clicked once the flood is over, reaches the admin API with
	// nothing but the session: its cookie and its CSRF token.
	stop()
	if floodErr != nil {
		t.Fatalf("flood: %v", floodErr)
	}
	t.Logf("flood: %d requests, by code %v", floodRes.Requests, floodRes.ByCode)
	if floodRes.ByCode["accepted"] == 0 || floodRes.ByCode["limit_reached"] == 0 {
		t.Fatalf("flood: by code %v, want 202s and limit_reached", floodRes.ByCode)
	}
	{
		var result string
		if err := chromedp.Run(ctx,
			chromedp.Click(card+` button[data-action="reconcile"]`, chromedp.ByQuery),
			chromedp.Poll(`(() => { const r = document.querySelector(`+strconv.Quote(card+` [data-f="action_result"]`)+`); return r && r.textContent.startsWith("reconcile:") ? r.textContent : null; })()`,
				&result, chromedp.WithPollingTimeout(time.Minute)),
		); err != nil {
			t.Fatalf("reconcile button: %v", err)
		}
		if result != "reconcile: done" {
			t.Fatalf("reconcile button: %q", result)
		}
		if n := scrape(t, be.AdminAddr())[`flashgate_backend_reconciles_total{result="ok"}`]; n < 1 {
			t.Fatalf("reconciles_total{ok} = %v after the button", n)
		}
	}
	t.Logf("live view: charts %+v", later)
}
