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
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
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

// TestLiveView loads the backend's /ui/ in headless Chromium while a sale
// sells: the page logs in with the admin token, shows the sale, and its
// numbers (sold, requests/s) move without a reload. It keeps the screenshot
// as docs/live-view.png when FLASHGATE_SCREENSHOT is set.
func TestLiveView(t *testing.T) {
	const chromium = "/usr/bin/chromium"
	if _, err := os.Stat(chromium); err != nil {
		t.Fatal("chromium not found: install Debian's chromium package (scripts/stack.sh deps)")
	}
	cfg := e2eConfig(t)
	be := startBackend(t, cfg)
	gw := startGateway(t, cfg)
	s := newSale(400, 1)
	s.Title = "live view"
	createSale(t, cfg, be.AdminAddr(), s)
	awaitSale(t, gw, s.ID)

	// Unauthenticated: the login form, not the numbers.
	res, err := http.Get("http://" + be.AdminAddr() + "/ui/live.json")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("live.json without the token: %d", res.StatusCode)
	}

	// Buyers arrive steadily while the page is open: new ones buy, one who
	// already has is refused (limit_reached) every third request.
	toks := tokens(t, cfg, "live", 300)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			tok := toks[i%len(toks)]
			if i%3 == 0 {
				tok = toks[0]
			}
			req, _ := http.NewRequest("POST", "http://"+gw.Addr()+"/v1/sales/"+s.ID+"/orders", strings.NewReader(`{"quantity":1}`))
			req.Header.Set("Authorization", string(tok))
			if res, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		}
	})
	t.Cleanup(func() { close(stop); wg.Wait() })

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
	ctx, cancelT := context.WithTimeout(bctx, 90*time.Second)
	defer cancelT()

	sel := `.sale[data-sale="` + s.ID + `"] `
	var sold1, sold2, rps string
	if err := chromedp.Run(ctx,
		chromedp.Navigate("http://"+be.AdminAddr()+"/ui/"),
		chromedp.WaitVisible(`#token`, chromedp.ByQuery),
		chromedp.SendKeys(`#token`, cfg.Admin.Token, chromedp.ByQuery),
		chromedp.Click(`#login`, chromedp.ByQuery),
		chromedp.WaitVisible(sel+`[data-f="sold"]`, chromedp.ByQuery),
		chromedp.Text(sel+`[data-f="sold"]`, &sold1, chromedp.ByQuery),
	); err != nil {
		t.Fatalf("live view: %v", err)
	}
	// The numbers move: sold grows and requests/s is above 0 within a few
	// polls, with no reload.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := chromedp.Run(ctx,
			chromedp.Text(sel+`[data-f="sold"]`, &sold2, chromedp.ByQuery),
			chromedp.Text(sel+`[data-f="requests_per_sec"]`, &rps, chromedp.ByQuery),
		); err != nil {
			t.Fatal(err)
		}
		a, _ := strconv.Atoi(sold1)
		b, _ := strconv.Atoi(sold2)
		r, _ := strconv.ParseFloat(rps, 64)
		if b > a && r > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the live view did not move: sold %s then %s, requests/s %s", sold1, sold2, rps)
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Logf("live view: sold %s → %s, requests/s %s", sold1, sold2, rps)
	if os.Getenv("FLASHGATE_SCREENSHOT") != "" {
		var png []byte
		if err := chromedp.Run(ctx, chromedp.FullScreenshot(&png, 100)); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join("..", "docs", "live-view.png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
