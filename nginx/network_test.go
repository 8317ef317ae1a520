package nginx_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/config"
)

// clientHdr is the header the tests' nginx takes the client's address from (opts.clientHeader).
const clientHdr = "X-Test-Client"

// from is a request "from" client address a, as nginx sees it with opts.clientHeader.
func from(a string) map[string]string { return map[string]string{clientHdr: a} }

// TestClientIsASlash64: nginx's per-client limits key an IPv6 client by its /64 (one host
// holds a whole /64 and may send from any address of it) and an IPv4 client by its address.
// One request a second per client with a burst of one: the third request, each from another
// address of the same /64, is refused; a neighbouring /64 and another IPv4 address of the same
// /24 are not.
func TestClientIsASlash64(t *testing.T) {
	u := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })
	e := startNginx(t, opts{gateways: []string{u.addr}, rate: 1, burst: 1, clientHeader: clientHdr})
	url := e.base + "/v1/sales/s1"
	for _, c := range []struct {
		addr, what string
		status     int
	}{
		{"2001:db8:1:2::1", "a /64's first request", 200},
		{"2001:db8:1:2:ffff:ffff:ffff:fffe", "another address of the same /64 (the burst)", 200},
		{"2001:db8:1:2:a:b:c:d", "a third address of the same /64", 429},
		{"2001:db8:1:3::1", "the next /64 of the same /48", 200},
		// Newline bytes (0x0a) in the /64: the key's regex must match them too.
		{"a0a:a0a:a0a:a0a::1", "a /64 with newline bytes", 200},
		{"a0a:a0a:a0a:a0a::2", "its second address (the burst)", 200},
		{"a0a:a0a:a0a:a0a:a0a::3", "its third address", 429},
		{"10.1.2.3", "an IPv4 address", 200},
		{"10.1.2.3", "the same again (the burst)", 200},
		{"10.1.2.4", "its neighbour in the same /24", 200},
		{"10.1.2.3", "the first IPv4 address a third time", 429},
	} {
		r := do(t, "GET", url, "", nil, from(c.addr))
		if r.Status != c.status {
			t.Errorf("%s (%s): %d %s, want %d", c.what, c.addr, r.Status, r.Raw, c.status)
		}
		if r.Status == 429 && r.code() != string(flashgate.CodeRateLimited) {
			t.Errorf("%s: 429 %s, want code rate_limited", c.what, r.Raw)
		}
	}
}

// TestNetworkTier: a host with many /64s (a /48 holds 65,536) meets the looser per-network
// limit: three requests from three /64s of one /48 pass (NGINX_NET_BURST 2 above the first),
// the fourth from a fourth /64 is refused; another /48 is not. IPv4 has no network tier: ten
// addresses of one /24 all pass.
func TestNetworkTier(t *testing.T) {
	u := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })
	e := startNginx(t, opts{gateways: []string{u.addr}, rate: 1000, burst: 1000,
		netRate: 1, netBurst: 2, clientHeader: clientHdr})
	url := e.base + "/v1/sales/s1"
	for i := range 4 {
		a := "2001:db8:5:" + strconv.Itoa(i+1) + "::1"
		want := 200
		if i == 3 {
			want = 429
		}
		if r := do(t, "GET", url, "", nil, from(a)); r.Status != want {
			t.Errorf("request %d of the /48, from %s: %d %s, want %d", i+1, a, r.Status, r.Raw, want)
		}
	}
	if r := do(t, "GET", url, "", nil, from("2001:db8:6:1::1")); r.Status != 200 {
		t.Errorf("another /48: %d %s, want 200", r.Status, r.Raw)
	}
	for i := range 10 {
		a := "10.9.0." + strconv.Itoa(i+1)
		if r := do(t, "GET", url, "", nil, from(a)); r.Status != 200 {
			t.Errorf("IPv4 %s (the %dth of its /24): %d %s, want 200", a, i+1, r.Status, r.Raw)
		}
	}
}

// TestSlowBodiesFromOneSlash64: the purchases in flight are counted per client, so a host
// trickling bodies from a new address of its /64 for each gets no more than NGINX_BODY_CONN
// of them (here 2) at once; the next, from a third address, is a JSON 429 at once.
func TestSlowBodiesFromOneSlash64(t *testing.T) {
	u := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(202)
	})
	e := startNginx(t, opts{gateways: []string{u.addr}, rate: 1000, burst: 1000, bodyConn: 2,
		clientHeader: clientHdr, status: true})
	var slow []net.Conn
	t.Cleanup(func() {
		for _, c := range slow {
			c.Close()
		}
	})
	for i := range 2 {
		c, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		slow = append(slow, c)
		if _, err := io.WriteString(c, "POST /v1/sales/s1/orders HTTP/1.1\r\nHost: x\r\n"+clientHdr+": 2001:db8:7:8::"+
			strconv.Itoa(i+1)+"\r\nContent-Length: 100\r\n\r\n{"); err != nil {
			t.Fatal(err)
		}
	}
	// Both taken up (and the status request itself) before the third is sent (see TestSlowBodyPerIP).
	for deadline := time.Now().Add(20 * time.Second); ; {
		n, err := e.writing()
		if err != nil {
			t.Fatal(err)
		}
		if n >= len(slow)+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nginx took up %d of the %d slow bodies in 20 s:\n%s", n-1, len(slow), e.errorLog())
		}
		time.Sleep(20 * time.Millisecond)
	}
	res, body := rawExchange(t, e.addr, "POST /v1/sales/s1/orders HTTP/1.1\r\nHost: x\r\n"+clientHdr+
		": 2001:db8:7:8:dead:beef::3\r\nContent-Length: 2\r\n\r\n{}")
	if res.StatusCode != 429 || !strings.Contains(string(body), `"code":"rate_limited"`) {
		t.Fatalf("a third purchase in flight from the /64: %d %s, want 429 rate_limited", res.StatusCode, body)
	}
	// Another /64 is another client.
	res, body = rawExchange(t, e.addr, "POST /v1/sales/s1/orders HTTP/1.1\r\nHost: x\r\n"+clientHdr+
		": 2001:db8:7:9::1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
	if res.StatusCode != 202 {
		t.Fatalf("a purchase from another /64: %d %s, want the gateway's 202", res.StatusCode, body)
	}
}

// TestBodyHasADeadline: a purchase body that trickles in, a byte every 500 ms (never a gap
// of client_body_timeout), is not held for as long as it keeps trickling: nginx passes it on
// as it comes, and the gateway's read_timeout (2 s here) ends it from its first byte. The
// connection is over within a few seconds, never kept for the 10 s the test would trickle.
func TestBodyHasADeadline(t *testing.T) {
	g := startGatewayWith(t, nil, func(c *config.Config) { c.Gateway.ReadTimeout = 2 * time.Second })
	e := startNginx(t, opts{gateways: []string{g.g.Addr()}, rate: 1000, burst: 1000})
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := io.WriteString(c, "POST /v1/sales/"+g.sale.ID+"/orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+
		g.token(t, "slow")+"\r\nContent-Length: 900\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := c.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	_ = c.SetReadDeadline(start.Add(10 * time.Second))
	got, err := io.ReadAll(c)
	took := time.Since(start)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a body trickling a byte every 500 ms still open after %v (answer so far %q)", took, got)
	}
	if took > 6*time.Second {
		t.Fatalf("a trickling body ended after %v, want within the gateway's read_timeout (2 s) and a margin", took)
	}
	if len(got) > 0 && !strings.Contains(string(got), `"code":"`) {
		t.Fatalf("the trickling body's answer is not the API's JSON: %q", got)
	}
	t.Logf("a trickling body ended after %v: %q", took.Round(time.Millisecond), firstLine(got))
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\r\n")
	return s
}

// TestBodyOver1KiB: nginx refuses what the gateway would (gateway.max_body_bytes, 1 KiB) with
// the same 413, on every path (a trailing slash too), and nothing reaches the gateway.
func TestBodyOver1KiB(t *testing.T) {
	u := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(202) })
	e := startNginx(t, opts{gateways: []string{u.addr}, rate: 1000, burst: 1000})
	big := []byte(`{"quantity":1,"address":"` + strings.Repeat("x", 1100) + `"}`)
	for _, p := range []string{"/v1/sales/s1/orders", "/v1/sales/s1/orders/", "/v1/sales/s1/queue"} {
		r := do(t, "POST", e.base+p, "", big, nil)
		if r.Status != 413 || r.code() != string(flashgate.CodeBodyTooLarge) {
			t.Errorf("POST %s with %d bytes: %d %s, want 413 body_too_large", p, len(big), r.Status, r.Raw)
		}
	}
	if r := do(t, "POST", e.base+"/v1/sales/s1/orders", "", big[:1000], nil); r.Status != 202 {
		t.Errorf("a 1000-byte body: %d %s, want the gateway's answer", r.Status, r.Raw)
	}
	for len(u.requests) > 0 {
		if r := <-u.requests; r.ContentLength > 1024 {
			t.Fatalf("%s %s with %d bytes reached the gateway", r.Method, r.URL, r.ContentLength)
		}
	}
}

// TestSoldOutCopyKeyedBySale: nginx's sold-out copy is the sale's, whatever the body: once the
// gateway's 409 is kept, purchases with other bodies (another quantity, a region, an unknown
// field, other spacing) are answered from it and never reach the gateway.
func TestSoldOutCopyKeyedBySale(t *testing.T) {
	var mu sync.Mutex
	purchases := 0
	u := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		purchases++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		// Kept to the end of a second well after the test's requests.
		w.Header().Set("X-Accel-Expires", "@"+strconv.FormatInt(time.Now().Unix()+5, 10))
		w.WriteHeader(409)
		_, _ = io.WriteString(w, `{"code":"sold_out","message":"sold out"}`)
	})
	e := startNginx(t, opts{gateways: []string{u.addr}, rate: 1000, burst: 1000})
	url := e.base + "/v1/sales/s1/orders"
	for i, b := range []string{`{"quantity":1}`, `{"quantity":2}`, `{"region":"bj"}`, `{"quantity":1,"x":1}`,
		`{ "quantity" : 1 }`, ``} {
		r := do(t, "POST", url, "", []byte(b), nil)
		if r.Status != 409 || r.code() != string(flashgate.CodeSoldOut) {
			t.Fatalf("purchase %d (%s): %d %s, want 409 sold_out", i, b, r.Status, r.Raw)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if purchases != 1 {
		t.Fatalf("six purchases of a sold-out sale with six bodies: the gateway saw %d, want 1 (the copy is the sale's)", purchases)
	}
}
