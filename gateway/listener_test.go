package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
)

// holdIdle opens n connections, each with one request answered, left idle
// (keep-alive): they hold their slots until closed.
func holdIdle(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte("GET /v1/sales/none HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("idle connection %d: %v", i, err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 404 {
			t.Fatalf("idle connection %d: %d", i, res.StatusCode)
		}
	}
	return conns
}

// readyz is the admin port's /readyz status.
func (e *env) readyz() int {
	e.t.Helper()
	res, err := http.Get("http://" + e.g.AdminAddr() + "/readyz")
	if err != nil {
		e.t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// jsonRefusal reads one response from c and checks it is status with a JSON
// body of code.
func jsonRefusal(t *testing.T, r *bufio.Reader, status int, code string) *http.Response {
	t.Helper()
	res, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatalf("want %d %s: %v", status, code, err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var v struct{ Code, Message string }
	if err := json.Unmarshal(body, &v); err != nil || res.StatusCode != status || v.Code != code || v.Message == "" {
		t.Fatalf("got %d %q (%v), want %d with JSON code %q", res.StatusCode, body, err, status, code)
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	return res
}

// TestConnCapRefusesInJSONAndRecovers: the connection cap, whether set by
// gateway.max_conns or gateway.concurrency (fasthttp's cap, which answers in
// plain text), refuses the excess with the API's 503, /readyz says so, and
// once the idle connections go the port serves again by itself.
func TestConnCapRefusesInJSONAndRecovers(t *testing.T) {
	for name, mut := range map[string]func(*config.Config){
		"max_conns":   func(c *config.Config) { c.Gateway.MaxConns = 8 },
		"concurrency": func(c *config.Config) { c.Gateway.Concurrency = 8 },
	} {
		t.Run(name, func(t *testing.T) {
			e := start(t, mut)
			if got := e.readyz(); got != 200 {
				t.Fatalf("readyz before: %d", got)
			}
			held := holdIdle(t, e.g.Addr(), 8)
			c, err := net.Dial("tcp", e.g.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			// The request is already sent: the refusal must still arrive (the
			// close lingers), not a reset.
			c.Write([]byte("GET /v1/sales/none HTTP/1.1\r\nHost: x\r\n\r\n"))
			res := jsonRefusal(t, bufio.NewReader(c), 503, "unavailable")
			if ra := res.Header.Get("Retry-After"); ra != "1" && ra != "2" && ra != "3" {
				t.Fatalf("Retry-After %q", res.Header.Get("Retry-After"))
			}
			if got := e.readyz(); got != 503 {
				t.Fatalf("readyz at the cap: %d", got)
			}
			for _, c := range held {
				c.Close()
			}
			released := time.Now()
			for {
				res, err := http.Get(e.url + "/v1/sales/none")
				if err == nil {
					io.Copy(io.Discard, res.Body)
					res.Body.Close()
					if res.StatusCode == 404 {
						break
					}
				}
				if time.Since(released) > time.Second {
					t.Fatalf("not serving 1 s after the connections were released: %v %v", res, err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if got := e.readyz(); got != 200 {
				t.Fatalf("readyz after: %d", got)
			}
			// At least the refusal read above (a request of the loop that met
			// the cap while the released connections were still closing on the
			// server's side counts too).
			if n := refusedAtCap(e.metricsText()); n < 1 {
				t.Fatalf("refusal not counted: %d", n)
			}
		})
	}
}

func (e *env) metricsText() string {
	e.t.Helper()
	res, err := http.Get("http://" + e.g.AdminAddr() + "/metrics")
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

// refusedAtCap reads flashgate_gateway_conns_refused_total{reason="max_conns"}.
func refusedAtCap(metrics string) int {
	for _, l := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(l, `flashgate_gateway_conns_refused_total{reason="max_conns"} `); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestConnCap(t *testing.T) {
	for _, c := range []struct {
		maxConns, concurrency int
		fd                    uint64
		want                  int
	}{
		{0, 0, 1024, 768},
		{0, 0, 1 << 20, 1<<20 - 512},
		{0, 1000, 1 << 20, 1000},
		{50, 1000, 1 << 20, 50},
		{50, 10, 1 << 20, 10},
		{0, 0, 0, 1 << 30},
	} {
		if got := connCap(c.maxConns, c.concurrency, c.fd); got != c.want {
			t.Errorf("connCap(%d, %d, %d) = %d, want %d", c.maxConns, c.concurrency, c.fd, got, c.want)
		}
	}
}

// TestSilentAndStalledConnectionsAreClosed: a connection that never sends a
// byte is closed at read_timeout (fasthttp alone waits for ever), and one that
// stalls mid-request gets a JSON 408 and is closed.
func TestSilentAndStalledConnectionsAreClosed(t *testing.T) {
	const rt = 300 * time.Millisecond
	e := start(t, func(c *config.Config) { c.Gateway.ReadTimeout = rt })
	const silent = 50
	done := make(chan error, silent)
	for i := 0; i < silent; i++ {
		c, err := net.Dial("tcp", e.g.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		go func() {
			// The bound only tells "closed" from "never closed"; the close
			// itself comes at read_timeout.
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
			n, err := c.Read(make([]byte, 1))
			if err == io.EOF && n == 0 {
				done <- nil
				return
			}
			done <- fmt.Errorf("read %d bytes, %v", n, err)
		}()
	}
	stalled, err := net.Dial("tcp", e.g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	begun := time.Now()
	stalled.Write([]byte("GET /v1/sales/none HTTP/1.1\r\nHost: x\r\nX-Half: "))
	_ = stalled.SetReadDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(stalled)
	jsonRefusal(t, br, 408, "invalid_request")
	if d := time.Since(begun); d < rt-50*time.Millisecond {
		t.Fatalf("408 after %v, before read_timeout %v", d, rt)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("stalled connection left open after its 408: %v", err)
	}
	// A body that stalls: the same 408.
	body, err := net.Dial("tcp", e.g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	body.Write([]byte("POST /v1/sales/none/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"quantity\""))
	_ = body.SetReadDeadline(time.Now().Add(20 * time.Second))
	jsonRefusal(t, bufio.NewReader(body), 408, "invalid_request")
	for i := 0; i < silent; i++ {
		if err := <-done; err != nil {
			t.Fatalf("silent connection: %v", err)
		}
	}
}

// TestPerIPCapSparesTrustedProxies: a direct client gets the per-address cap;
// a trusted proxy (nginx, all of whose connections share its address) does not.
func TestPerIPCapSparesTrustedProxies(t *testing.T) {
	if config.Default().Gateway.MaxConnsPerIP <= 0 {
		t.Fatal("gateway.max_conns_per_ip has no default: the direct port is uncapped per address")
	}
	e := start(t, func(c *config.Config) {
		c.Gateway.MaxConnsPerIP = 2
		c.Gateway.TrustedProxies = []string{"127.0.0.1/32"}
	})
	held := holdIdle(t, e.g.Addr(), 5) // all served: 127.0.0.1 is the proxy
	for _, c := range held {
		c.Close()
	}
	e = start(t, func(c *config.Config) {
		c.Gateway.MaxConnsPerIP = 2
		c.Gateway.TrustedProxies = []string{"10.0.0.1/32"}
	})
	holdIdle(t, e.g.Addr(), 2)
	c, err := net.Dial("tcp", e.g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	jsonRefusal(t, bufio.NewReader(c), 429, "rate_limited")
	if m := e.metricsText(); !strings.Contains(m, `flashgate_gateway_conns_refused_total{reason="per_ip"} 1`) ||
		!strings.Contains(m, `flashgate_gateway_limiter_refusals_total{limit="conns"} 1`) {
		t.Fatalf("refusal not counted:\n%s", grepLines(m, "conns"))
	}
}

// TestOversizedBodyGets413: a Go client writing a 64 KiB body reads the 413,
// every time: the gateway answers, then drains the rest before it closes.
func TestOversizedBodyGets413(t *testing.T) {
	e := start(t)
	s := e.sale(nil)
	body := bytes.Repeat([]byte("a"), 64<<10)
	const tries = 500
	client := &http.Client{Timeout: 20 * time.Second}
	failed := 0
	var first error
	for i := 0; i < tries; i++ {
		req, _ := http.NewRequest("POST", e.url+"/v1/sales/"+s.ID+"/orders", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer x")
		res, err := client.Do(req)
		if err == nil {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 413 || !strings.Contains(string(b), `"code":"body_too_large"`) {
				err = fmt.Errorf("%d %s", res.StatusCode, b)
			}
		}
		if err != nil {
			if failed++; first == nil {
				first = err
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d oversized requests did not read their 413; first: %v", failed, tries, first)
	}
}

// The EMFILE test runs a real gateway in a child process with a low
// descriptor limit (lowered for the child alone: the test binary's own
// connections are unaffected).
const emfileChildEnv = "FLASHGATE_TEST_EMFILE_CHILD"

// emfileChild is the child: it lowers RLIMIT_NOFILE (soft and hard, so the
// gateway cannot raise it back), serves, prints its addresses and runs until
// its stdin closes.
func emfileChild() int {
	limit, _ := strconv.ParseUint(os.Getenv(emfileChildEnv), 10, 64)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: limit, Max: limit}); err != nil {
		fmt.Println("setrlimit:", err)
		return 1
	}
	cfg, err := config.Load("")
	if err != nil {
		fmt.Println("config:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g, clients, err := dialAndStart(ctx, cfg)
	if err != nil {
		fmt.Println("start:", err)
		return 1
	}
	defer clients.Close()
	fmt.Printf("ADDR %s %s\n", g.Addr(), g.AdminAddr())
	signal.Ignore(syscall.SIGPIPE)
	io.Copy(io.Discard, os.Stdin)
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	_ = g.Shutdown(sctx)
	return 0
}

// TestAcceptSurvivesEMFILE: the gateway runs out of file descriptors under a
// flood of connections (its connection cap set above its limit, so accept
// itself fails with EMFILE); once they go, it serves new connections within a
// second, by itself.
func TestAcceptSurvivesEMFILE(t *testing.T) {
	cfg := testenv.Config(t)
	cfg.Gateway.MaxConns = 100000
	cfg.Gateway.MaxConnsPerIP = 0
	const limit, flood = 128, 300
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), config.Environ(cfg)...), fmt.Sprintf("%s=%d", emfileChildEnv, limit))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	m := regexp.MustCompile(`^ADDR (\S+) (\S+)`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("child: %q %v", line, err)
	}
	addr, admin := m[1], m[2]
	get := func(url string) (int, string, error) {
		c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		res, err := c.Get(url)
		if err != nil {
			return 0, "", err
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b), nil
	}
	if st, _, err := get("http://" + addr + "/v1/sales/none"); st != 404 {
		t.Fatalf("before: %d %v", st, err)
	}
	// The flood: each connection sends a request and waits; the kernel
	// completes the handshakes the gateway cannot accept.
	var flooded []net.Conn
	for i := 0; i < flood; i++ {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			break
		}
		flooded = append(flooded, c)
		c.Write([]byte("GET /v1/sales/none HTTP/1.1\r\nHost: x\r\n\r\n"))
	}
	// Past its descriptors, the gateway answers only part of the flood.
	answered := 0
	wait := time.Now().Add(time.Second)
	for _, c := range flooded {
		_ = c.SetReadDeadline(wait)
		if n, _ := c.Read(make([]byte, 1)); n == 1 {
			answered++
		}
	}
	if answered >= len(flooded) {
		t.Fatalf("all %d flood connections answered: the descriptor limit %d was never reached", answered, limit)
	}
	for _, c := range flooded {
		c.Close()
	}
	released := time.Now()
	for {
		st, _, err := get("http://" + addr + "/v1/sales/none")
		if st == 404 {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("the gateway exited: %v", err)
		default:
		}
		if time.Since(released) > time.Second {
			t.Fatalf("not serving 1 s after the flood left: %d %v", st, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, metrics, err := get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mm := regexp.MustCompile(`(?m)^flashgate_gateway_accept_errors_total (\d+)`).FindStringSubmatch(metrics)
	if mm == nil || mm[1] == "0" {
		t.Fatalf("accept errors not counted: %v", mm)
	}
	t.Logf("flood %d, answered %d, accept errors %s", len(flooded), answered, mm[1])
}

// failingListener fails its first fails Accepts with err, then accepts from
// the real listener.
type failingListener struct {
	net.Listener
	fails int
	err   error
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.fails > 0 {
		l.fails--
		return nil, l.err
	}
	return l.Listener.Accept()
}

// TestAcceptBacksOff: temporary accept errors are retried with back-off (and
// counted, and reported as not ready meanwhile); any other error ends Accept.
func TestAcceptBacksOff(t *testing.T) {
	real, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer real.Close()
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ECONNABORTED} {
		fl := &failingListener{Listener: real, fails: 4, err: &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}}
		l := newEdgeListener(fl, edgeOptions{maxConns: 10})
		got := make(chan net.Conn, 1)
		go func() {
			c, err := l.Accept()
			if err != nil {
				t.Errorf("%v: Accept: %v", errno, err)
			}
			got <- c
		}()
		// 5+10+20+40 ms of back-off: it is seen meanwhile.
		for l.notAccepting() == "" {
			time.Sleep(time.Millisecond)
		}
		c, err := net.Dial("tcp", real.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		sc := <-got
		if sc == nil {
			t.Fatalf("%v: no connection", errno)
		}
		if why := l.notAccepting(); why != "" {
			t.Fatalf("%v: still not accepting after an accept: %s", errno, why)
		}
		if n := counterValue(l.acceptErrors); n != 4 {
			t.Fatalf("%v: %v accept errors counted, want 4", errno, n)
		}
		sc.Close()
		c.Close()
	}
	fl := &failingListener{Listener: real, fails: 1, err: &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EINVAL)}}
	if _, err := newEdgeListener(fl, edgeOptions{maxConns: 10}).Accept(); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("a permanent error: %v", err)
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

func TestConnKeyGroupsIPv6By64(t *testing.T) {
	for in, want := range map[string]string{
		"2001:db8:1:2:aaaa::1": "2001:db8:1:2::",
		"2001:db8:1:2:bbbb::9": "2001:db8:1:2::",
		"2001:db8:1:3::1":      "2001:db8:1:3::",
		"192.0.2.7":            "192.0.2.7",
	} {
		if got := connKey(netip.MustParseAddr(in)); got != netip.MustParseAddr(want) {
			t.Errorf("connKey(%s) = %s, want %s", in, got, want)
		}
	}
}
