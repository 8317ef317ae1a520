// Tests of the edge nginx (nginx/nginx.conf) run the real nginx binary on the rendered template,
// each on its own ports and prefix directory, in front of a real gateway (wire.StartGateway, real
// Redis and NATS of the local stack) or of a stand-in upstream where the test must see what
// nginx sends. They fail, never skip, when nginx or the stack's servers are missing.
package nginx_test

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
)

// TestConfigTest: nginx -t passes on the template as the tests render it, and on the config
// scripts/stack.sh generates (defaults and overrides from the environment).
func TestConfigTest(t *testing.T) {
	bin := nginxBin(t)
	// The tests' rendering (startNginx runs nginx -t on it).
	e := startNginx(t, opts{gateways: []string{"127.0.0.1:1", "127.0.0.1:2"}})
	e.stop()

	if _, err := exec.LookPath("envsubst"); err != nil {
		t.Fatal("envsubst not found: run `make deps` (installs gettext-base)")
	}
	for _, c := range []struct {
		name string
		env  []string
		want []string
	}{
		{"defaults", nil, []string{
			"listen 127.0.0.1:8000 ", "rate=20r/s;", "burst=40 nodelay;", "limit_conn per_ip_conn 32;",
			"server 127.0.0.1:8080 max_fails=3 fail_timeout=5s;", "proxy_read_timeout 5s;",
			"worker_rlimit_nofile ", "worker_connections ", "limit_conn per_ip_body 8;",
			"zone=per_net:10m rate=320r/s;", "zone=per_net burst=640 nodelay;", "limit_conn per_net_conn 512;",
			"limit_conn per_net_body 128;", "client_max_body_size 1k;"}},
		{"overrides", []string{"NGINX_RATE=7", "NGINX_BURST=3", "NGINX_CONN=9", "NGINX_READ_TIMEOUT=2s",
			"NGINX_GATEWAYS=127.0.0.1:9001,127.0.0.1:9002", "NGINX_BODY_CONN=64", "NGINX_NET_RATE=70",
			"NGINX_NET_BURST=30", "NGINX_NET_CONN=90", "NGINX_NET_BODY_CONN=640"}, []string{
			"rate=7r/s;", "burst=3 nodelay;", "limit_conn per_ip_conn 9;", "proxy_read_timeout 2s;",
			"server 127.0.0.1:9001 max_fails=3", "server 127.0.0.1:9002 max_fails=3",
			"limit_conn per_ip_body 64;", "zone=per_net:10m rate=70r/s;", "zone=per_net burst=30 nodelay;",
			"limit_conn per_net_conn 90;", "limit_conn per_net_body 640;"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			conf := filepath.Join(dir, "nginx.conf")
			cmd := exec.Command("bash", "../scripts/stack.sh", "nginx-conf", conf)
			cmd.Env = append(envWithoutNginx(), c.env...)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("scripts/stack.sh nginx-conf: %v\n%s", err, out)
			}
			raw, err := os.ReadFile(conf)
			if err != nil {
				t.Fatal(err)
			}
			s := string(raw)
			if m := regexp.MustCompile(`\$\{NGINX_[A-Z_]+\}`).FindString(s); m != "" {
				t.Fatalf("%s left unrendered", m)
			}
			for _, w := range c.want {
				if !strings.Contains(s, w) {
					t.Errorf("generated config lacks %q", w)
				}
			}
			// nginx's own variables must survive envsubst.
			for _, v := range []string{"$binary_remote_addr", "$remote_addr", "$request_id", "$upstream_response_time"} {
				if !strings.Contains(s, v) {
					t.Errorf("generated config lost %s (envsubst substituted it?)", v)
				}
			}
			// -t opens the logs the config names (var/log, append) but writes no pid file.
			if err := os.Mkdir(filepath.Join(dir, "tmp"), 0o755); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(bin, "-t", "-p", dir+"/", "-c", conf, "-e", filepath.Join(dir, "error.log"), "-g", globals("")).CombinedOutput()
			if err != nil {
				t.Fatalf("nginx -t on the stack's config: %v\n%s", err, out)
			}
		})
	}
	for _, bad := range []string{"NGINX_RATE=20r/s", "NGINX_BURST=0", "NGINX_BODY_CONN=0", "NGINX_NET_RATE=x",
		"NGINX_NET_BURST=-1", "NGINX_NET_CONN=65536", "NGINX_NET_BODY_CONN=8k"} {
		t.Run("bad value refused "+bad, func(t *testing.T) {
			cmd := exec.Command("bash", "../scripts/stack.sh", "nginx-conf", filepath.Join(t.TempDir(), "x.conf"))
			cmd.Env = append(envWithoutNginx(), bad)
			out, err := cmd.CombinedOutput()
			if name, _, _ := strings.Cut(bad, "="); err == nil || !strings.Contains(string(out), name) {
				t.Fatalf("%s accepted: %v\n%s", bad, err, out)
			}
		})
	}
}

// envWithoutNginx is the environment without the caller's NGINX_* settings, nor its
// STACK_PORT_OFFSET (the defaults are what is checked; make test runs with the caller's offset).
func envWithoutNginx() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NGINX_") && !strings.HasPrefix(kv, "STACK_PORT_OFFSET=") {
			env = append(env, kv)
		}
	}
	return env
}

// TestPurchaseThroughNginx: the static page, a purchase and the sale's info, all through nginx.
func TestPurchaseThroughNginx(t *testing.T) {
	g := startGateway(t, nil)
	e := startNginx(t, opts{gateways: []string{g.g.Addr()}})
	s := g.sale

	r := do(t, "POST", e.base+"/v1/sales/"+s.ID+"/orders", g.token(t, "alice"), []byte(`{"quantity":1}`), nil)
	if r.Status != 202 || r.code() != "accepted" || r.JSON["order_id"] == "" || r.JSON["status"] != "pending" {
		t.Fatalf("purchase through nginx: %d %s", r.Status, r.Raw)
	}
	// The gateway's own refusals pass through untouched (not turned into nginx's pages).
	wantError(t, do(t, "POST", e.base+"/v1/sales/"+s.ID+"/orders", g.token(t, "alice"), []byte(`{}`), nil), 403, string(flashgate.CodeLimitReached))
	wantError(t, do(t, "POST", e.base+"/v1/sales/"+s.ID+"/orders", "", []byte(`{}`), nil), 401, string(flashgate.CodeUnauthorized))
	wantError(t, do(t, "GET", e.base+"/v1/sales/nosuchsale", "", nil, nil), 404, string(flashgate.CodeSaleNotFound))

	info := do(t, "GET", e.base+"/v1/sales/"+s.ID, "", nil, nil)
	if info.Status != 200 || info.JSON["id"] != s.ID || info.JSON["state"] != "active" {
		t.Fatalf("sale info through nginx: %d %s", info.Status, info.Raw)
	}
	// Micro-cached: the next GET within the second is nginx's copy.
	if again := do(t, "GET", e.base+"/v1/sales/"+s.ID+"?bust=1", "", nil, nil); again.Header.Get("X-Cache-Status") != "HIT" || string(again.Raw) != string(info.Raw) {
		t.Errorf("second GET of the sale: X-Cache-Status %q (want HIT, query string ignored)", again.Header.Get("X-Cache-Status"))
	}

	page := do(t, "GET", e.base+"/", "", nil, nil)
	if page.Status != 200 || !strings.HasPrefix(page.ContentType, "text/html") || !strings.Contains(string(page.Raw), "/sale.js") {
		t.Fatalf("GET /: %d %q %.200s", page.Status, page.ContentType, page.Raw)
	}
	if page.Header.Get("Server") != "nginx" || page.Header.Get("Content-Security-Policy") == "" {
		t.Errorf("GET /: Server %q (want no version), CSP %q", page.Header.Get("Server"), page.Header.Get("Content-Security-Policy"))
	}
	js := do(t, "GET", e.base+"/sale.js", "", nil, nil)
	if js.Status != 200 || js.ContentType != "application/javascript" || !strings.Contains(string(js.Raw), "/v1/sales/") {
		t.Fatalf("GET /sale.js: %d %q", js.Status, js.ContentType)
	}

	// The access log: one compact line each, the gateway's status and a request id.
	var purchase *logLine
	for _, l := range e.accessLog(8) {
		if strings.HasPrefix(l.request, "POST /v1/sales/"+s.ID+"/orders") && l.status == "202" {
			purchase = &l
		}
	}
	if purchase == nil || purchase.upstreamStatus != "202" || !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(purchase.requestID) {
		t.Fatalf("access log has no proper line for the purchase: %+v", purchase)
	}
}

// TestProxyHeaders: what a gateway receives. The client's address is the one nginx saw, whatever
// the client claims; every request has its own id; connections to the gateway are kept alive.
func TestProxyHeaders(t *testing.T) {
	u := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	})
	e := startNginx(t, opts{gateways: []string{u.addr}})
	const n = 20
	ids := map[string]bool{}
	for i := 0; i < n; i++ {
		r := do(t, "POST", e.base+"/v1/sales/x/orders", "tok", []byte(`{}`), map[string]string{
			"X-Forwarded-For": "6.6.6.6", "X-Real-IP": "6.6.6.6", "Forwarded": "for=6.6.6.6",
			"X-Request-Id": "client-chosen",
		})
		if r.Status != 200 {
			t.Fatalf("status %d %s", r.Status, r.Raw)
		}
		got := <-u.requests
		for h, want := range map[string]string{
			"X-Forwarded-For": "127.0.0.1", "X-Real-IP": "127.0.0.1", "Forwarded": "",
			"X-Forwarded-Proto": "http", "Authorization": "Bearer tok", "Connection": "",
		} {
			if v := strings.Join(got.Header.Values(h), ","); v != want {
				t.Errorf("gateway got %s: %q, want %q", h, v, want)
			}
		}
		// $host: the client's Host without its port.
		if host, _, _ := strings.Cut(e.addr, ":"); got.Proto != "HTTP/1.1" || got.Host != host {
			t.Errorf("gateway got %s, Host %q", got.Proto, got.Host)
		}
		id := got.Header.Get("X-Request-Id")
		if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(id) || ids[id] {
			t.Fatalf("X-Request-Id %q: want nginx's own, new per request", id)
		}
		ids[id] = true
	}
	if c := len(u.conns); c > 2 {
		t.Errorf("%d requests took %d upstream connections: keep-alive to the gateway not working", n, c)
	}
}

// TestBurstFromOneIP: one address sending far more than its rate gets nginx's 429s, docs/design.md §3
// shaped, and the gateway sees only what nginx let through.
func TestBurstFromOneIP(t *testing.T) {
	g := startGateway(t, func(s *flashgate.Sale) { s.Total = 1000 })
	e := startNginx(t, opts{gateways: []string{g.g.Addr()}, rate: 5, burst: 5})
	tok := g.token(t, "burster")
	url := e.base + "/v1/sales/" + g.sale.ID + "/orders"

	const sent, workers = 200, 10
	var (
		mu       sync.Mutex
		limited  []reply
		passed   = map[int]int{}
		next     atomic.Int64
		wg       sync.WaitGroup
		failures []error
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= sent {
				r, err := try("POST", url, tok, []byte(`{"quantity":1}`), nil)
				mu.Lock()
				switch {
				case err != nil:
					failures = append(failures, err)
				case r.Status == 429:
					limited = append(limited, r)
				default:
					passed[r.Status]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d requests failed, first: %v", len(failures), failures[0])
	}
	forwarded := 0
	for _, c := range passed {
		forwarded += c
	}
	t.Logf("%d sent: %d refused by nginx (429), %d reached the gateway %v", sent, len(limited), forwarded, passed)
	if len(limited) == 0 || forwarded >= sent {
		t.Fatalf("no 429 from a burst of %d at 5 r/s (burst 5)", sent)
	}
	// Rate 5/s, burst 5: about 6 pass at once, then one per 200 ms while the burst lasts.
	if forwarded > 40 {
		t.Errorf("%d of %d passed the 5 r/s limit", forwarded, sent)
	}
	retryAfters := map[string]int{}
	for _, r := range limited {
		wantError(t, r, 429, string(flashgate.CodeRateLimited))
		if !nginxRetryAfter(r.RetryAfter) || r.JSON["message"] != "too many requests from your address, retry shortly" {
			t.Fatalf("429 not nginx's: Retry-After %q, body %s", r.RetryAfter, r.Raw)
		}
		retryAfters[r.RetryAfter]++
	}
	// Drawn per request: a burst's refusals do not all send their clients back at one second.
	if len(limited) >= 50 && len(retryAfters) < 2 {
		t.Errorf("%d refusals, Retry-After %v: not spread", len(limited), retryAfters)
	}
	// The gateway's side: only the forwarded requests reached it (nginx's log of each request's
	// upstream status), and it answered each (202 for the first, 403 limit_reached after).
	lines := e.accessLog(sent)
	upstream := 0
	for _, l := range lines {
		if l.upstreamStatus != "-" {
			upstream++
		} else if l.status != "429" {
			t.Errorf("answered by nginx without being refused: %s", l.raw)
		}
	}
	if upstream != forwarded || passed[202] != 1 || passed[202]+passed[403] != forwarded {
		t.Fatalf("gateway got %d requests (nginx log), clients saw %d answers from it: %v", upstream, forwarded, passed)
	}
}

// TestConnLimit: more concurrent requests from one address than NGINX_CONN get the same 429.
func TestConnLimit(t *testing.T) {
	release := make(chan struct{})
	inflight := make(chan struct{}, 10)
	u := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		inflight <- struct{}{}
		<-release
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	})
	e := startNginx(t, opts{gateways: []string{u.addr}, rate: 1000, burst: 1000, conn: 2})
	var wg sync.WaitGroup
	slow := make([]reply, 2)
	for i := range slow {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := try("GET", e.base+"/v1/sales/x/orders/1", "", nil, nil)
			if err != nil {
				t.Error(err)
			}
			slow[i] = r
		}()
	}
	for range slow {
		select {
		case <-inflight:
		case <-time.After(5 * time.Second):
			t.Fatal("the upstream never got the two slow requests")
		}
	}
	third := do(t, "GET", e.base+"/v1/sales/x/orders/2", "", nil, nil)
	close(release)
	wg.Wait()
	wantError(t, third, 429, string(flashgate.CodeRateLimited))
	if !nginxRetryAfter(third.RetryAfter) {
		t.Errorf("Retry-After %q", third.RetryAfter)
	}
	for _, r := range slow {
		if r.Status != 200 {
			t.Errorf("a request within the limit: %d %s", r.Status, r.Raw)
		}
	}
}

// TestGatewayDown: a stopped gateway gives the JSON 502; a silent one the JSON 504.
func TestGatewayDown(t *testing.T) {
	t.Run("stopped 502", func(t *testing.T) {
		g := startGateway(t, nil)
		e := startNginx(t, opts{gateways: []string{g.g.Addr()}})
		url := e.base + "/v1/sales/" + g.sale.ID + "/orders"
		if r := do(t, "POST", url, g.token(t, "bob"), []byte(`{}`), nil); r.Status != 202 {
			t.Fatalf("purchase before the stop: %d %s", r.Status, r.Raw)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.g.Shutdown(ctx); err != nil {
			t.Fatalf("gateway shutdown: %v", err)
		}
		for _, path := range []string{"/orders", "/orders/1"} {
			method := map[string]string{"/orders": "POST", "/orders/1": "GET"}[path]
			r := do(t, method, e.base+"/v1/sales/"+g.sale.ID+path, g.token(t, "carol"), []byte(`{}`), nil)
			wantError(t, r, 502, string(flashgate.CodeUnavailable))
			if !nginxRetryAfter(r.RetryAfter) {
				t.Errorf("502 without Retry-After: %q", r.RetryAfter)
			}
		}
	})
	t.Run("silent 504", func(t *testing.T) {
		e := startNginx(t, opts{gateways: []string{blackhole(t)}, readTimeout: "1s"})
		start := time.Now()
		r := do(t, "POST", e.base+"/v1/sales/x/orders", "tok", []byte(`{}`), nil)
		wantError(t, r, 504, string(flashgate.CodeUnavailable))
		if !nginxRetryAfter(r.RetryAfter) || time.Since(start) > 4*time.Second {
			t.Errorf("504 after %v, Retry-After %q", time.Since(start), r.RetryAfter)
		}
	})
}

// TestRetries: a purchase is never sent to a second gateway once one got it (it is not
// idempotent); one that never reached a gateway (connection refused) goes to the next.
func TestRetries(t *testing.T) {
	t.Run("refused connection: next gateway", func(t *testing.T) {
		u := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(202) })
		e := startNginx(t, opts{gateways: []string{freeAddr(t), u.addr}})
		for i := 0; i < 6; i++ {
			if r := do(t, "POST", e.base+"/v1/sales/x/orders", "tok", []byte(`{}`), nil); r.Status != 202 {
				t.Fatalf("POST %d with one gateway down: %d %s", i, r.Status, r.Raw)
			}
		}
	})
	t.Run("request sent: never again", func(t *testing.T) {
		u := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(202) })
		drop, dropped := dropper(t)
		e := startNginx(t, opts{gateways: []string{drop, u.addr}})
		// Round robin: some requests go to the dropper first. A POST it swallowed must come back
		// as a 502 and must not reach the other gateway; a GET it swallowed is retried there.
		var posts502, gets int
		// POST, GET, GET, …: round robin alternates, so both methods meet the dropper.
		for i := 0; i < 12 && (posts502 == 0 || gets == 0); i++ {
			before, seen := dropped(), len(u.requests)
			method := "GET"
			if i%3 == 0 {
				method = "POST"
			}
			r := do(t, method, e.base+"/v1/sales/x/orders", "tok", []byte(`{}`), nil)
			// Let the dropper count what it read.
			time.Sleep(20 * time.Millisecond)
			swallowed, reached := dropped()-before, len(u.requests)-seen
			switch {
			case swallowed == 0 && reached == 1 && r.Status == 202:
				// went to the healthy one first
			case method == "POST" && swallowed == 1 && reached == 0:
				wantError(t, r, 502, string(flashgate.CodeUnavailable))
				posts502++
			case method == "GET" && swallowed == 1 && reached == 1 && r.Status == 202:
				gets++
			default:
				t.Fatalf("%s: dropper got %d, healthy gateway got %d, answer %d %s", method, swallowed, reached, r.Status, r.Raw)
			}
		}
		if posts502 == 0 || gets == 0 {
			t.Fatalf("round robin never sent a POST (%d) and a GET (%d) to the failing gateway", posts502, gets)
		}
	})
}

// TestLimits: bodies and headers over nginx's limits get JSON answers from nginx. nginx's body
// limit is the gateway's (1 KiB): a body over it is nginx's 413, one of 1 KiB goes through.
func TestLimits(t *testing.T) {
	g := startGateway(t, nil)
	e := startNginx(t, opts{gateways: []string{g.g.Addr()}})
	url := e.base + "/v1/sales/" + g.sale.ID + "/orders"
	tok := g.token(t, "dave")

	big := []byte(`{"quantity":1,"region":"` + strings.Repeat("x", 20<<10) + `"}`)
	const nginxMsg = "request body too large"
	r := do(t, "POST", url, tok, big, nil)
	wantError(t, r, 413, string(flashgate.CodeBodyTooLarge))
	if r.JSON["message"] != nginxMsg {
		t.Errorf("a 20 KiB body: want nginx's 413, got %s", r.Raw)
	}
	mid := []byte(`{"quantity":1,"region":"` + strings.Repeat("x", 2<<10) + `"}`)
	r = do(t, "POST", url, tok, mid, nil)
	wantError(t, r, 413, string(flashgate.CodeBodyTooLarge))
	if r.JSON["message"] != nginxMsg {
		t.Errorf("a 2 KiB body: want nginx's 413, got %s", r.Raw)
	}
	pad := `{"quantity":1,"region":"`
	kib := []byte(pad + strings.Repeat("x", 1024-len(pad)-2) + `"}`)
	if r = do(t, "POST", url, tok, kib, nil); r.Status == 413 || len(kib) != 1024 {
		t.Errorf("a body of %d bytes: %d %s, want the gateway's answer (a 400: no such region)", len(kib), r.Status, r.Raw)
	}

	res, body := rawRequest(t, e.addr, "GET /v1/sales/"+g.sale.ID+" HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("y", 9000)+"\r\n\r\n")
	if res.StatusCode != 431 || res.Header.Get("Content-Type") != "application/json" || !strings.Contains(string(body), `"code":"invalid_request"`) {
		t.Fatalf("oversized header: %d %q %s", res.StatusCode, res.Header.Get("Content-Type"), body)
	}
}

// nginxRetryAfter reports whether s is a Retry-After nginx's own refusals give: 1, 2 or 3
// seconds, drawn per request ($fg_retry_after in nginx.conf).
func nginxRetryAfter(s string) bool { return s == "1" || s == "2" || s == "3" }
