package nginx_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/internal/wire"
	"github.com/flashgate/flashgate/lua"
)

// TestMain keeps the gateway's logs out of the test output unless -v.
func TestMain(m *testing.M) {
	flag.Parse()
	if !testing.Verbose() {
		slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	os.Exit(m.Run())
}

// nginxBin is the real nginx (Debian puts it in /usr/sbin, not on every PATH).
func nginxBin(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx"} {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	t.Fatal("nginx not found on PATH nor in /usr/sbin: run `make deps` (installs the Debian package nginx)")
	return ""
}

// freeAddr is a loopback address no one listens on right now.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// opts are the template's values; zero fields take the stack's defaults.
type opts struct {
	gateways    []string
	rate, burst int
	conn        int
	bodyConn    int // purchases in flight per client (NGINX_BODY_CONN)
	// the per-network tier (an IPv6 /48): NGINX_NET_RATE, _BURST, _CONN, _BODY_CONN
	netRate, netBurst, netConn, netBodyConn int
	readTimeout                             string
	// clientHeader: nginx takes the client's address from this request header (the realip
	// module, trusting 127.0.0.1), so that a test on loopback can be any client, IPv6 too.
	clientHeader string
	// status adds, for the test only, a server on a port of its own answering nginx's counters
	// (the stub_status module): edge.writing reads them.
	status bool
	// marks is the directory nginx looks for the gateways' sold-out marks in (docs/gateway.md);
	// "": one of the test's own, which no gateway writes.
	marks string
}

// render fills the ${NGINX_*} names of nginx/nginx.conf as scripts/stack.sh does with envsubst.
func render(t testing.TB, tmpl string, vars map[string]string) string {
	t.Helper()
	raw, err := os.ReadFile(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	s := string(raw)
	for k, v := range vars {
		s = strings.ReplaceAll(s, "${"+k+"}", v)
	}
	if m := regexp.MustCompile(`\$\{(NGINX|BENCH)_[A-Z_]+\}`).FindString(s); m != "" {
		t.Fatalf("%s: %s left unrendered", tmpl, m)
	}
	return s
}

// edge is one real nginx, run by the test as a child process on a config of its own.
type edge struct {
	t      testing.TB
	dir    string // the prefix: config, logs, pid, temp files
	addr   string
	base   string // http://addr
	status string // http://host:port/status when opts.status
	cmd    *exec.Cmd
	exited chan struct{}
}

// userArgs are the -g directives scripts/stack.sh gives: workers as root when we are root (the
// checkout may not be readable by "nobody").
func globals(extra string) string {
	g := extra
	if os.Geteuid() == 0 {
		g += " user root root;"
	}
	return g
}

func (e *edge) args(extra ...string) []string {
	return append([]string{"-p", e.dir + "/", "-c", filepath.Join(e.dir, "nginx.conf"),
		"-e", filepath.Join(e.dir, "nginx-error.log")}, extra...)
}

// startNginx renders nginx/nginx.conf for o, checks it with nginx -t, and runs nginx in the
// foreground until the test ends.
func startNginx(t testing.TB, o opts) *edge {
	t.Helper()
	bin := nginxBin(t)
	html, err := filepath.Abs("html")
	if err != nil {
		t.Fatal(err)
	}
	if o.rate == 0 {
		o.rate, o.burst = 20, 40
	}
	if o.conn == 0 {
		o.conn = 32
	}
	if o.bodyConn == 0 {
		o.bodyConn = 8
	}
	if o.netRate == 0 {
		o.netRate, o.netBurst = 320, 640
	}
	if o.netConn == 0 {
		o.netConn = 512
	}
	if o.netBodyConn == 0 {
		o.netBodyConn = 128
	}
	if o.readTimeout == "" {
		o.readTimeout = "5s"
	}
	if o.marks == "" {
		o.marks = t.TempDir()
	}
	var servers []string
	for _, g := range o.gateways {
		servers = append(servers, "        server "+g+" max_fails=3 fail_timeout=5s;")
	}
	for attempt := 0; ; attempt++ {
		e := &edge{t: t, dir: t.TempDir(), exited: make(chan struct{})}
		if err := os.Mkdir(filepath.Join(e.dir, "tmp"), 0o755); err != nil {
			t.Fatal(err)
		}
		e.addr = freeAddr(t)
		e.base = "http://" + e.addr
		conf := render(t, "nginx.conf", map[string]string{
			"NGINX_LISTEN":             e.addr,
			"NGINX_LISTEN_EXTRA":       "",
			"NGINX_UPSTREAM_SERVERS":   strings.Join(servers, "\n"),
			"NGINX_RATE":               strconv.Itoa(o.rate),
			"NGINX_BURST":              strconv.Itoa(o.burst),
			"NGINX_CONN":               strconv.Itoa(o.conn),
			"NGINX_BODY_CONN":          strconv.Itoa(o.bodyConn),
			"NGINX_NET_RATE":           strconv.Itoa(o.netRate),
			"NGINX_NET_BURST":          strconv.Itoa(o.netBurst),
			"NGINX_NET_CONN":           strconv.Itoa(o.netConn),
			"NGINX_NET_BODY_CONN":      strconv.Itoa(o.netBodyConn),
			"NGINX_READ_TIMEOUT":       o.readTimeout,
			"NGINX_HTML":               html,
			"NGINX_LOG_DIR":            e.dir,
			"NGINX_PID":                filepath.Join(e.dir, "nginx.pid"),
			"NGINX_RLIMIT_NOFILE":      "4096",
			"NGINX_WORKER_CONNECTIONS": "2016",
			"NGINX_MARKS":              o.marks,
		})
		if o.status {
			// Inside the http block (the template's last brace), beside the production server.
			statusAddr := freeAddr(t)
			e.status = "http://" + statusAddr + "/status"
			end := strings.LastIndex(conf, "}")
			conf = conf[:end] + "    server {\n        listen " + statusAddr + ";\n        location = /status { stub_status; }\n    }\n}\n"
		}
		if o.clientHeader != "" {
			// First in the http block: every server's requests then come "from" the header's
			// address, as they would from a real client of it (the limits key on it).
			i := strings.Index(conf, "\nhttp {\n") + len("\nhttp {\n")
			conf = conf[:i] + "    set_real_ip_from 127.0.0.1;\n    real_ip_header " + o.clientHeader + ";\n" + conf[i:]
		}
		if err := os.WriteFile(filepath.Join(e.dir, "nginx.conf"), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(bin, e.args("-t", "-q", "-g", globals(""))...).CombinedOutput(); err != nil {
			t.Fatalf("nginx -t on the rendered nginx/nginx.conf: %v\n%s", err, out)
		}
		e.cmd = exec.Command(bin, e.args("-g", globals("daemon off;"))...)
		var stderr bytes.Buffer
		e.cmd.Stdout, e.cmd.Stderr = &stderr, &stderr
		if err := e.cmd.Start(); err != nil {
			t.Fatalf("start nginx: %v", err)
		}
		go func() { _ = e.cmd.Wait(); close(e.exited) }()
		if e.waitUp() {
			t.Cleanup(e.stop)
			return e
		}
		e.stop()
		logs := stderr.String() + e.errorLog()
		if attempt < 2 && strings.Contains(logs, "Address already in use") {
			continue // another process took the free port in between: take another
		}
		t.Fatalf("nginx did not serve on %s within 5s:\n%s", e.addr, logs)
	}
}

func (e *edge) waitUp() bool {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-e.exited:
			return false
		default:
		}
		if c, err := net.DialTimeout("tcp", e.addr, 200*time.Millisecond); err == nil {
			c.Close()
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// stop asks for a graceful shutdown (SIGQUIT: workers finish, logs are flushed), then kills.
func (e *edge) stop() {
	select {
	case <-e.exited:
		return
	default:
	}
	_ = e.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-e.exited:
	case <-time.After(5 * time.Second):
		_ = e.cmd.Process.Kill()
		<-e.exited
	}
}

var stubWritingRE = regexp.MustCompile(`Writing: (\d+)`)

// writing is stub_status's "Writing": the requests nginx has read the headers of and has not
// finished, this one (the status request) included. A request is counted there just before
// nginx runs its phases, limit_conn's among them.
func (e *edge) writing() (int, error) {
	if e.status == "" {
		return 0, errors.New("nginx started without opts.status")
	}
	res, err := client.Get(e.status)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, err
	}
	m := stubWritingRE.FindSubmatch(b)
	if res.StatusCode != 200 || m == nil {
		return 0, fmt.Errorf("stub_status answered %d %q", res.StatusCode, b)
	}
	return strconv.Atoi(string(m[1]))
}

func (e *edge) errorLog() string {
	b, _ := os.ReadFile(filepath.Join(e.dir, "nginx-error.log"))
	return string(b)
}

// logLine is one line of the "edge" access log format.
type logLine struct {
	raw, request, status, upstreamStatus, requestID string
}

var logRE = regexp.MustCompile(`^\S+ \[[^\]]+\] "([^"]*)" (\d{3}) \d+ rt=\S+ urt=\S+ us=(\S+) ua=\S+ cache=\S+ rid=(\S+)$`)

// accessLog waits until the access log (flushed each second) has at least n lines and parses it.
func (e *edge) accessLog(n int) []logLine {
	e.t.Helper()
	var lines []logLine
	deadline := time.Now().Add(5 * time.Second)
	for {
		lines = lines[:0]
		f, err := os.Open(filepath.Join(e.dir, "nginx-access.log"))
		if err == nil {
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				m := logRE.FindStringSubmatch(sc.Text())
				if m == nil {
					f.Close()
					e.t.Fatalf("access log line not in the edge format: %q", sc.Text())
				}
				lines = append(lines, logLine{raw: sc.Text(), request: m[1], status: m[2], upstreamStatus: m[3], requestID: m[4]})
			}
			f.Close()
		}
		if len(lines) >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(lines) < n {
		e.t.Fatalf("access log has %d lines, want at least %d", len(lines), n)
	}
	return lines
}

// reply is one answer, with its JSON body decoded when it is JSON.
type reply struct {
	Status      int
	ContentType string
	RetryAfter  string
	Header      http.Header
	Raw         []byte
	JSON        map[string]any
}

func (r reply) code() string { s, _ := r.JSON["code"].(string); return s }

var client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

func do(t testing.TB, method, url, token string, body []byte, hdr map[string]string) reply {
	t.Helper()
	r, err := try(method, url, token, body, hdr)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return r
}

func try(method, url, token string, body []byte, hdr map[string]string) (reply, error) {
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return reply{}, err
	}
	r := reply{Status: res.StatusCode, ContentType: res.Header.Get("Content-Type"),
		RetryAfter: res.Header.Get("Retry-After"), Header: res.Header, Raw: raw}
	if strings.HasPrefix(r.ContentType, "application/json") {
		if err := json.Unmarshal(raw, &r.JSON); err != nil {
			return r, fmt.Errorf("status %d: body %q is not JSON: %w", r.Status, raw, err)
		}
	}
	return r, nil
}

// wantError checks a docs/design.md §3 error answer: the status, Content-Type application/json, and a
// body of exactly {"code": code, "message": "<non-empty>"}, and for limit_reached the limit's
// "dimension" too.
func wantError(t testing.TB, r reply, status int, code string) {
	t.Helper()
	if r.Status != status || !strings.HasPrefix(r.ContentType, "application/json") {
		t.Fatalf("got %d %q %q, want %d application/json", r.Status, r.ContentType, r.Raw, status)
	}
	msg, _ := r.JSON["message"].(string)
	fields := 2
	if code == string(flashgate.CodeLimitReached) {
		if dim, _ := r.JSON["dimension"].(string); dim == "" {
			t.Fatalf("body %q: limit_reached without its dimension", r.Raw)
		}
		fields = 3
	}
	if len(r.JSON) != fields || r.code() != code || msg == "" {
		t.Fatalf("body %q: want exactly {\"code\":%q,\"message\":\"…\"} (and a limit_reached's dimension)", r.Raw, code)
	}
}

// gw is an in-process gateway (the real one) with a sale it knows.
type gw struct {
	cfg  config.Config
	g    *wire.Gateway
	sale *flashgate.Sale
}

// startGateway warms a sale in Redis, then starts a gateway (which loads every indexed sale at
// start) on a free port. Its own rate limits are off: every 429 seen is nginx's.
func startGateway(t testing.TB, mut func(*flashgate.Sale)) *gw {
	t.Helper()
	return startGatewayWith(t, mut, nil)
}

// startGatewayWith is startGateway with the gateway's configuration changed by cfgMut.
func startGatewayWith(t testing.TB, mut func(*flashgate.Sale), cfgMut func(*config.Config)) *gw {
	t.Helper()
	cfg := testenv.Config(t)
	if cfgMut != nil {
		cfgMut(&cfg)
	}
	cfg.RateLimit.PerIP.Rate, cfg.RateLimit.PerUser.Rate, cfg.RateLimit.PerSale.Rate = 0, 0, 0
	rc := testenv.Redis(t, cfg.Redis.Addrs)
	now := time.Now().UTC().Truncate(time.Millisecond)
	s := &flashgate.Sale{ID: testenv.ID("ngx"), Title: "nginx test", PriceCents: 100, Total: 100,
		StartsAt: now.Add(-time.Minute), EndsAt: now.Add(time.Hour), PerUserLimit: 1, PerOrderMax: 1}
	if mut != nil {
		mut(s)
	}
	if err := s.Validate(); err != nil {
		t.Fatalf("sale: %v", err)
	}
	cleanRedis(t, rc, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := lua.Load().Warm(ctx, rc, s, map[string]int64{"": s.Total}); err != nil {
		t.Fatalf("warm: %v", err)
	}
	g, err := wire.StartGateway(ctx, cfg)
	if err != nil {
		t.Fatalf("start gateway: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = g.Shutdown(ctx)
	})
	return &gw{cfg: cfg, g: g, sale: s}
}

func (g *gw) token(t testing.TB, user string) string {
	t.Helper()
	tok, err := auth.MintHS256(g.cfg.Auth.JWTSecret, user, auth.MintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// cleanRedis removes the sale's keys when the test ends (the Redis is shared).
func cleanRedis(t testing.TB, rc rueidis.Client, s *flashgate.Sale) {
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		k := lua.KeysFor(s.ID, s.RegionNames())
		keys := []string{k.Meta, k.Users, k.Resv, k.Orders, k.Idem}
		_, stock := k.StockKeys()
		keys = append(keys, stock...)
		rc.Do(c, rc.B().Del().Key(keys...).Build())
		lua.Unindex(c, rc, s.ID)
	})
}

// upstream is a stand-in gateway written in the test, for what the real one cannot show: the
// headers nginx sends, connection reuse, a gateway that hangs or drops a request.
type upstream struct {
	addr     string
	requests chan *http.Request
	conns    chan struct{}
}

// startUpstream serves h on a free port and reports each request (with its headers) and each
// new connection.
func startUpstream(t testing.TB, h http.HandlerFunc) *upstream {
	t.Helper()
	u := &upstream{requests: make(chan *http.Request, 1000), conns: make(chan struct{}, 1000)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = ln.Addr().String()
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case u.requests <- r.Clone(context.Background()):
			default:
			}
			h(w, r)
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				select {
				case u.conns <- struct{}{}:
				default:
				}
			}
		},
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return u
}

// dropper accepts connections, reads one request's headers, then closes without answering: a
// gateway that dies after the request reached it. It counts the requests it swallowed.
func dropper(t testing.TB) (addr string, got func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	n := make(chan struct{}, 1000)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					if line == "\r\n" {
						n <- struct{}{}
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), func() int { return len(n) }
}

// blackhole accepts connections and reads forever, never answering.
func blackhole(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			go func() { _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// rawRequest writes raw on a new connection and reads one response.
func rawRequest(t testing.TB, addr, raw string) (*http.Response, []byte) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res, body
}
