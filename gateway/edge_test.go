package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
)

func TestClientIP(t *testing.T) {
	trusted, _ := parseProxies([]string{"127.0.0.1/32", "10.0.0.0/8"})
	cases := []struct {
		peer, xff, realIP, want string
		p                       proxies
	}{
		{"192.0.2.1:5", "", "", "192.0.2.1", trusted},
		{"192.0.2.1:5", "203.0.113.9", "203.0.113.10", "192.0.2.1", trusted}, // untrusted peer: headers ignored
		{"127.0.0.1:5", "203.0.113.9", "", "203.0.113.9", trusted},
		{"127.0.0.1:5", "198.51.100.1, 203.0.113.9", "", "203.0.113.9", trusted}, // right-most wins
		{"127.0.0.1:5", "203.0.113.9, 10.1.2.3", "", "203.0.113.9", trusted},     // skip trusted hops
		{"127.0.0.1:5", "garbage, 203.0.113.9", "", "203.0.113.9", trusted},      // left of the client: ignored
		{"127.0.0.1:5", "203.0.113.9, garbage", "", "127.0.0.1", trusted},        // malformed hop: trust nothing
		{"127.0.0.1:5", "", "203.0.113.11", "203.0.113.11", trusted},             // X-Real-IP from nginx
		{"127.0.0.1:5", "::ffff:203.0.113.12", "", "203.0.113.12", trusted},      // v4-mapped
		{"127.0.0.1:5", "203.0.113.9", "", "127.0.0.1", nil},                     // no trusted proxies at all
		{"[2001:db8::1]:5", "203.0.113.9", "", "2001:db8::1", trusted},
	}
	for _, c := range cases {
		var ctx fasthttp.RequestCtx
		addr, err := net.ResolveTCPAddr("tcp", c.peer)
		if err != nil {
			t.Fatal(err)
		}
		ctx.Init(&fasthttp.Request{}, addr, nil)
		if c.xff != "" {
			ctx.Request.Header.Set("X-Forwarded-For", c.xff)
		}
		if c.realIP != "" {
			ctx.Request.Header.Set("X-Real-IP", c.realIP)
		}
		if got := c.p.clientIP(&ctx).String(); got != c.want {
			t.Errorf("peer %s XFF %q X-Real-IP %q: %s, want %s", c.peer, c.xff, c.realIP, got, c.want)
		}
	}
}

// limitsOn starts a gateway with the given limits (testenv turns them off).
func limitsOn(t *testing.T, rl config.RateLimit, mut ...func(*config.Config)) *env {
	return start(t, append([]func(*config.Config){func(c *config.Config) { c.RateLimit = rl }}, mut...)...)
}

func (e *env) buyFrom(s *flashgate.Sale, user, xff string) reply {
	hdr := map[string]string{}
	if xff != "" {
		hdr["X-Forwarded-For"] = xff
	}
	return e.buy(s, e.token(user), `{}`, hdr)
}

func TestPerIPLimitBelievesOnlyTrustedProxies(t *testing.T) {
	rl := config.RateLimit{PerIP: config.Rate{Rate: 0.01, Burst: 2}}

	t.Run("behind a trusted proxy each client has its bucket", func(t *testing.T) {
		e := limitsOn(t, rl) // loopback is trusted by default, as nginx's address
		s := e.sale(func(s *flashgate.Sale) { s.Total, s.PerUserLimit, s.PerOrderMax = 100, 1, 1 })
		for i, want := range []int{202, 202, 429} {
			r := e.buyFrom(s, "a"+strconv.Itoa(i), "203.0.113.7")
			if r.Status != want {
				t.Fatalf("request %d from 203.0.113.7: %d %s, want %d", i, r.Status, r.Raw, want)
			}
			if want == 429 && (r.Code != "rate_limited" || r.RetryAfter == "") {
				t.Fatalf("429 without its code or Retry-After: %s %q", r.Raw, r.RetryAfter)
			}
		}
		if r := e.buyFrom(s, "b", "203.0.113.8"); r.Status != 202 {
			t.Fatalf("another client behind the same proxy: %d %s", r.Status, r.Raw)
		}
		if rem, resv := e.stock(s); rem != 97 || resv != 3 {
			t.Fatalf("remaining %d, %d reservations: a 429 reserved something", rem, resv)
		}
	})

	t.Run("a spoofed header from an untrusted peer changes nothing", func(t *testing.T) {
		e := limitsOn(t, rl, func(c *config.Config) { c.Gateway.TrustedProxies = []string{"10.0.0.0/8"} })
		s := e.sale(func(s *flashgate.Sale) { s.Total, s.PerUserLimit, s.PerOrderMax = 100, 1, 1 })
		// Every request claims another address; all are this machine's.
		for i, want := range []int{202, 202, 429, 429} {
			r := e.buyFrom(s, "s"+strconv.Itoa(i), "198.51.100."+strconv.Itoa(i+1))
			if r.Status != want {
				t.Fatalf("spoofed request %d: %d %s, want %d", i, r.Status, r.Raw, want)
			}
		}
	})
}

func TestPerUserPerSaleAndInflightLimits(t *testing.T) {
	t.Run("per user", func(t *testing.T) {
		e := limitsOn(t, config.RateLimit{PerUser: config.Rate{Rate: 0.01, Burst: 1}})
		s := e.sale(func(s *flashgate.Sale) { s.PerUserLimit, s.PerOrderMax = 5, 1 })
		if r := e.buyFrom(s, "alice", ""); r.Status != 202 {
			t.Fatalf("first: %d %s", r.Status, r.Raw)
		}
		if r := e.buyFrom(s, "alice", ""); r.Status != 429 || r.Code != "rate_limited" {
			t.Fatalf("second by the same user: %d %s", r.Status, r.Raw)
		}
		if r := e.buyFrom(s, "bob", ""); r.Status != 202 {
			t.Fatalf("another user: %d %s", r.Status, r.Raw)
		}
	})
	t.Run("per sale", func(t *testing.T) {
		e := limitsOn(t, config.RateLimit{PerSale: config.Rate{Rate: 0.01, Burst: 2}})
		s := e.sale(nil)
		other := e.sale(nil)
		for i, want := range []int{202, 202, 429} {
			if r := e.buyFrom(s, "u"+strconv.Itoa(i), ""); r.Status != want {
				t.Fatalf("admission %d: %d %s, want %d", i, r.Status, r.Raw, want)
			}
		}
		if r := e.buyFrom(other, "u9", ""); r.Status != 202 {
			t.Fatalf("another sale: %d %s", r.Status, r.Raw)
		}
		if rem, resv := e.stock(s); rem != s.Total-2 || resv != 2 {
			t.Fatalf("remaining %d, %d reservations after a 429", rem, resv)
		}
	})
	t.Run("max in flight", func(t *testing.T) {
		rs := testenv.StartRedis(t)
		e := limitsOn(t, config.RateLimit{MaxInflight: 1}, func(c *config.Config) {
			c.Redis.Addrs = []string{rs.Addr}
			c.Gateway.AdmitTimeout = 3 * time.Second
		})
		s := e.sale(nil)
		// Hold one request in flight: Redis sleeps under it.
		go e.rc.Do(context.Background(), e.rc.B().Arbitrary("DEBUG", "SLEEP").Args("1").Build())
		time.Sleep(50 * time.Millisecond)
		first := make(chan reply, 1)
		go func() { first <- e.buyFrom(s, "held", "") }()
		deadline := time.Now().Add(5 * time.Second)
		for e.g.limits.Inflight() == 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if r := e.buyFrom(s, "second", ""); r.Status != 429 || r.Code != "rate_limited" {
			t.Fatalf("second while one is in flight: %d %s", r.Status, r.Raw)
		}
		if r := <-first; r.Status != 202 {
			t.Fatalf("the held request: %d %s", r.Status, r.Raw)
		}
		if r := e.buyFrom(s, "third", ""); r.Status != 202 {
			t.Fatalf("after the slot came back: %d %s", r.Status, r.Raw)
		}
	})
}

// writeConfig writes a configuration file whose rate-limit block is the
// per_ip line given and every other limit off (a key left out of the file
// takes its default, as at start).
func writeConfig(t *testing.T, path string, perIP string) {
	t.Helper()
	rl := perIP + "  per_user: {rate: 0, burst: 0}\n  per_sale: {rate: 0, burst: 0}\n  max_inflight: 0\n"
	// Write then rename, as config managers do.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte("ratelimit:\n"+rl), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func (e *env) limitsView() map[string]any {
	e.t.Helper()
	req, _ := http.NewRequest("GET", "http://"+e.g.AdminAddr()+"/admin/v1/limits", nil)
	req.Header.Set("Authorization", "Bearer "+e.cfg.Admin.Token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	var v map[string]any
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil {
		e.t.Fatal(err)
	}
	return v
}

func (e *env) awaitLimits(cond func(v map[string]any) bool) map[string]any {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v := e.limitsView()
		if cond(v) {
			return v
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("limits never changed: %v", v)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func perIPRate(v map[string]any) float64 {
	return v["limits"].(map[string]any)["per_ip"].(map[string]any)["rate"].(float64)
}

// TestLiveReloadUnderLoad changes the file while requests flow and sees the
// new per-IP rate take effect, without a restart or a dropped connection.
func TestLiveReloadUnderLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "flashgate.yaml")
	writeConfig(t, path, "  per_ip: {rate: 20, burst: 1}\n")
	e := start(t, func(c *config.Config) {
		c.Source = path
		c.RateLimit = config.RateLimit{PerIP: config.Rate{Rate: 20, Burst: 1}}
	})
	// A sold-out sale: requests that pass the limits answer 409 from memory.
	s := e.sale(func(s *flashgate.Sale) { s.Total, s.PerUserLimit, s.PerOrderMax = 1, 1, 1 })
	if r := e.buyFrom(s, "first", ""); r.Status != 202 {
		t.Fatalf("first: %d", r.Status)
	}
	tok := e.token("loader")
	var passed, limited, other atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest("POST", e.url+"/v1/sales/"+s.ID+"/orders", strings.NewReader(`{}`))
				req.Header.Set("Authorization", "Bearer "+tok)
				res, err := client.Do(req)
				if err != nil {
					other.Add(1)
					continue
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				switch res.StatusCode {
				case 409:
					passed.Add(1)
				case 429:
					limited.Add(1)
				default:
					other.Add(1)
				}
			}
		}()
	}
	window := func() (int64, int64) {
		p0, l0 := passed.Load(), limited.Load()
		time.Sleep(time.Second)
		return passed.Load() - p0, limited.Load() - l0
	}
	slowPass, slowLimited := window()
	writeConfig(t, path, "  per_ip: {rate: 400, burst: 1}\n")
	e.awaitLimits(func(v map[string]any) bool { return perIPRate(v) == 400 })
	fastPass, _ := window()

	// A broken file keeps the limits in force and says why.
	writeConfig(t, path, "  per_ip: {rate: -5, burst: 1}\n")
	v := e.awaitLimits(func(v map[string]any) bool { return v["last_reload_error"] != nil })
	if perIPRate(v) != 400 || !strings.Contains(v["last_reload_error"].(string), "per_ip") {
		t.Fatalf("after a bad reload: %v", v)
	}
	close(stop)
	wg.Wait()
	t.Logf("per_ip 20/s: %d passed, %d refused in 1 s; per_ip 400/s: %d passed in 1 s", slowPass, slowLimited, fastPass)
	if other.Load() != 0 {
		t.Fatalf("%d requests failed or got another status during the reloads (dropped connections?)", other.Load())
	}
	if slowLimited == 0 || slowPass > 30 {
		t.Fatalf("at 20/s: %d passed, %d refused", slowPass, slowLimited)
	}
	if fastPass < 3*slowPass {
		t.Fatalf("the new rate did not take effect: %d passed at 400/s vs %d at 20/s", fastPass, slowPass)
	}
}

func TestSIGHUPReloads(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "flashgate.yaml")
	writeConfig(t, path, "  per_ip: {rate: 7, burst: 7}\n")
	e := start(t, func(c *config.Config) { c.Source = path })
	before := e.limitsView()["loaded_at"].(string)
	time.Sleep(10 * time.Millisecond)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	v := e.awaitLimits(func(v map[string]any) bool { return v["loaded_at"].(string) != before })
	if perIPRate(v) != 7 {
		t.Fatalf("after SIGHUP: %v", v)
	}
}

// TestSlowLorisIsCutOff dribbles headers byte by byte: the gateway closes the
// connection at its read timeout, and serves others meanwhile.
func TestSlowLorisIsCutOff(t *testing.T) {
	e := start(t, func(c *config.Config) { c.Gateway.ReadTimeout = 500 * time.Millisecond })
	s := e.sale(nil)
	const loris = 20
	cut := make(chan time.Duration, loris)
	for i := 0; i < loris; i++ {
		go func() {
			c, err := net.Dial("tcp", e.g.Addr())
			if err != nil {
				cut <- -1
				return
			}
			defer c.Close()
			start := time.Now()
			msg := "POST /v1/sales/" + s.ID + "/orders HTTP/1.1\r\nHost: x\r\nX-Slow: " + strings.Repeat("a", 200)
			for j := 0; j < len(msg); j++ {
				if _, err := c.Write([]byte{msg[j]}); err != nil {
					cut <- time.Since(start)
					return
				}
				// Has the server hung up?
				_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
				if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
					cut <- time.Since(start)
					return
				}
			}
			cut <- -2 // never cut off
		}()
	}
	// Meanwhile an honest buyer is served.
	time.Sleep(100 * time.Millisecond)
	if r := e.buyFrom(s, "honest", ""); r.Status != 202 {
		t.Fatalf("honest request during the attack: %d %s", r.Status, r.Raw)
	}
	for i := 0; i < loris; i++ {
		d := <-cut
		// Dribbling all bytes takes ~13 s; being cut off means it ended long before.
		if d < 0 {
			t.Fatalf("a slow-loris connection was never cut off (%v)", d)
		}
		if d > 5*time.Second {
			t.Fatalf("cut off only after %v (read timeout 500ms)", d)
		}
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func TestServerLimits(t *testing.T) {
	e := start(t, func(c *config.Config) {
		c.Gateway.MaxHeaderBytes = 2048
		c.Gateway.MaxConnsPerIP = 2
		c.Gateway.TrustedProxies = nil // a trusted proxy has no per-address cap
	})
	s := e.sale(nil)
	// Headers over the limit: 431 with the JSON body.
	raw := "POST /v1/sales/" + s.ID + "/orders HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("b", 4096) + "\r\n\r\n"
	res, err := http.ReadResponse(bufioReader(t, e.g.Addr(), raw), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 431 || !strings.Contains(string(body), `"code":"invalid_request"`) {
		t.Fatalf("oversized headers: %d %s", res.StatusCode, body)
	}
	// Connections per IP: two held open, the third is refused with JSON.
	var held []net.Conn
	for i := 0; i < 2; i++ {
		c, err := net.Dial("tcp", e.g.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	c, err := net.Dial("tcp", e.g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	res, err = http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("third connection: %v", err)
	}
	body, _ = io.ReadAll(res.Body)
	if res.StatusCode != 429 || !strings.Contains(string(body), `"code":"rate_limited"`) {
		t.Fatalf("third connection: %d %s", res.StatusCode, body)
	}
	// Closing one frees its slot. (A refused connection is closed as soon as
	// its 429 is written, so a client may see a reset instead: retry.)
	held[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		req, _ := http.NewRequest("POST", e.url+"/v1/sales/"+s.ID+"/orders", strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer "+e.token("later"))
		req.Close = true
		res, err := http.DefaultClient.Do(req)
		status := 0
		if err == nil {
			status = res.StatusCode
			res.Body.Close()
		}
		if status == 202 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot never freed: %d %v", status, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestMetricsCountRequestsByRouteAndCode(t *testing.T) {
	e := limitsOn(t, config.RateLimit{PerUser: config.Rate{Rate: 0.01, Burst: 1}})
	s := e.sale(func(s *flashgate.Sale) { s.Total, s.PerUserLimit, s.PerOrderMax = 1, 1, 1 })
	e.buyFrom(s, "a", "") // 202, the last unit: marks the sale sold out
	e.buyFrom(s, "b", "") // 409 from memory
	e.buyFrom(s, "b", "") // 409 again: the mark answers before the token and the per-user limit
	later := e.sale(func(s *flashgate.Sale) {
		s.StartsAt, s.EndsAt = time.Now().Add(time.Hour), time.Now().Add(2*time.Hour)
	})
	e.buyFrom(later, "c", "") // 425 not started
	e.buyFrom(later, "c", "") // 429 per user
	e.do("GET", "/v1/sales/"+s.ID, "", nil, nil)
	res, err := http.Get("http://" + e.g.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{
		`flashgate_gateway_requests_total{code="accepted",route="purchase"} 1`,
		`flashgate_gateway_requests_total{code="sold_out",route="purchase"} 2`,
		`flashgate_gateway_requests_total{code="not_started",route="purchase"} 1`,
		`flashgate_gateway_requests_total{code="rate_limited",route="purchase"} 1`,
		`flashgate_gateway_requests_total{code="ok",route="sale"} 1`,
		`flashgate_gateway_limiter_refusals_total{limit="user"} 1`,
		`flashgate_gateway_soldout_marked_total 1`,
		`flashgate_gateway_admit_duration_seconds_count 1`,
		`flashgate_gateway_publish_duration_seconds_count 1`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if st, _ := e.admin("/debug/pprof/cmdline", e.cfg.Admin.Token); st != 200 {
		t.Fatalf("pprof with the admin token: %d", st)
	}
}

// TestReusePortSharesOnePort: two gateways on one port (one per core); both
// serve, and a purchase through the shared port works whichever answers.
func TestReusePortSharesOnePort(t *testing.T) {
	port := testenv.FreePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	reuse := func(c *config.Config) { c.Gateway.Listen, c.Gateway.ReusePort = addr, true }
	a := start(t, reuse)
	b := start(t, reuse, func(c *config.Config) { c.NATS, c.Auth = a.cfg.NATS, a.cfg.Auth })
	if a.g.Addr() != addr || b.g.Addr() != addr {
		t.Fatalf("listening on %s and %s, want both on %s", a.g.Addr(), b.g.Addr(), addr)
	}
	s := a.sale(nil)
	b.g.sales.put(s)
	for i := 0; i < 4; i++ {
		if r := a.buyFrom(s, "u"+strconv.Itoa(i), ""); r.Status != 202 {
			t.Fatalf("purchase %d through the shared port: %d %s", i, r.Status, r.Raw)
		}
	}
}

// TestSoldOutBeforeTheToken: a sold-out sale or region answers 409 before the
// token is checked (sold out is public, and a flood is mostly new tokens);
// what could be a replay (an Idempotency-Key), a region with stock or a body
// naming no region goes through the full checks.
func TestSoldOutBeforeTheToken(t *testing.T) {
	e := limitsOn(t, config.RateLimit{})
	s := e.sale(func(s *flashgate.Sale) {
		s.Total, s.PerUserLimit, s.PerOrderMax = 3, 1, 1
		s.Regions = map[string]int64{"bj": 1, "sh": 2}
	})
	if r := e.buy(s, e.token("a"), `{"region":"bj"}`, nil); r.Status != 202 {
		t.Fatalf("last bj unit: %+v", r)
	}
	if r := e.buy(s, e.token("b"), `{"region":"bj"}`, nil); r.Status != 409 { // marks bj sold out (if the admission did not)
		t.Fatalf("bj: %+v", r)
	}
	cases := []struct {
		what, token, body string
		hdr               map[string]string
		status            int
		code              string
	}{
		{"bad token, sold-out region", "not-a-token", `{"region":"bj"}`, nil, 409, "sold_out"},
		{"no token, sold-out region", "", `{"region":"bj"}`, nil, 409, "sold_out"},
		{"bad token, region with stock", "not-a-token", `{"region":"sh"}`, nil, 401, "unauthorized"},
		{"bad token, idempotency key", "not-a-token", `{"region":"bj"}`, map[string]string{"Idempotency-Key": "k1"}, 401, "unauthorized"},
		{"bad token, bad body", "not-a-token", `{"region":`, nil, 401, "unauthorized"},
		{"good token, region with stock", e.token("c"), `{"region":"sh"}`, nil, 202, "accepted"},
	}
	for _, c := range cases {
		if r := e.buy(s, c.token, c.body, c.hdr); r.Status != c.status || r.Code != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.what, r.Status, r.Code, c.status, c.code)
		}
	}
	if rem, resv := e.stock(s); rem != 1 || resv == 0 {
		t.Errorf("remaining %d, reservations %d: want 1 left and the 2 accepted reserved", rem, resv)
	}
}

// TestReloadShadowedByEnv: a rate-limit key that a FLASHGATE_* variable sets
// keeps the environment's value through a reload of the file, and
// GET /admin/v1/limits says which key and which variable, by the YAML key an
// operator edits.
func TestReloadShadowedByEnv(t *testing.T) {
	t.Setenv("FLASHGATE_RATELIMIT_PER_IP_RATE", "77")
	path := filepath.Join(t.TempDir(), "flashgate.yaml")
	writeConfig(t, path, "  per_ip: {rate: 20, burst: 5}\n")
	e := start(t, func(c *config.Config) {
		c.Source = path
		c.RateLimit = config.RateLimit{PerIP: config.Rate{Rate: 77, Burst: 5}}
	})
	v := e.limitsView()
	if sh, _ := v["shadowed_by_env"].(map[string]any); sh["ratelimit.per_ip.rate"] != "FLASHGATE_RATELIMIT_PER_IP_RATE" || len(sh) != 1 {
		t.Fatalf("shadowed_by_env at start: %v", v["shadowed_by_env"])
	}
	// The operator edits per_ip in the file: burst changes, rate stays the environment's.
	writeConfig(t, path, "  per_ip: {rate: 400, burst: 9}\n")
	v = e.awaitLimits(func(v map[string]any) bool {
		return v["limits"].(map[string]any)["per_ip"].(map[string]any)["burst"] == 9.0
	})
	if perIPRate(v) != 77 {
		t.Fatalf("per_ip.rate after the reload: %v, want the environment's 77", perIPRate(v))
	}
	if sh, _ := v["shadowed_by_env"].(map[string]any); sh["ratelimit.per_ip.rate"] != "FLASHGATE_RATELIMIT_PER_IP_RATE" {
		t.Fatalf("shadowed_by_env after the reload: %v", v["shadowed_by_env"])
	}
	for _, k := range []string{"per_ip", "per_user", "per_sale", "max_inflight"} {
		if _, ok := v["limits"].(map[string]any)[k]; !ok {
			t.Errorf("limits has no YAML key %s: %v", k, v["limits"])
		}
	}
}
