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
)

// slowBodyLen is the Content-Length the slow bodies announce: at two bytes a second they would
// take minutes to finish, far longer than the test.
const slowBodyLen = 1000

// TestSlowBodyPerIP: one address holding purchase bodies open gets no more than 8 of them in
// flight; the next purchase from it is a JSON 429 at once, and a body that stops arriving is cut
// at client_body_timeout (3 s) with the connection closed, never forwarded.
//
// The ninth is sent only once nginx shows (stub_status) that it has taken up the eight: a
// connection accepted is not yet a request counted. Each of nginx's workers accepts from a
// queue of its own (listen … reuseport), so on a loaded machine a ninth sent right after the
// eight could be read first, pass, and make the eighth slow body the one refused, after which
// no ninth was ever refused (two of five full parallel `make test` runs failed so, the access
// log showed the eighth's 429).
func TestSlowBodyPerIP(t *testing.T) {
	u := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(202) })
	e := startNginx(t, opts{gateways: []string{u.addr}, rate: 1000, burst: 1000, status: true})
	var slow []net.Conn
	t.Cleanup(func() {
		for _, c := range slow {
			c.Close()
		}
	})
	for i := 0; i < 8; i++ {
		c, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		slow = append(slow, c)
		if _, err := io.WriteString(c, "POST /v1/sales/s1/orders HTTP/1.1\r\nHost: x\r\nContent-Length: "+
			strconv.Itoa(slowBodyLen)+"\r\n\r\n{"); err != nil {
			t.Fatal(err)
		}
	}
	// The eight send a byte of body every 500 ms, so that client_body_timeout (3 s between reads)
	// cuts none of them while the ninth is tried, however slowly a loaded machine runs the test.
	// slow[0] stops first: it is the one whose cut is checked below.
	stop := make([]chan struct{}, len(slow))
	var trickle sync.WaitGroup
	for i, c := range slow {
		stop[i] = make(chan struct{})
		trickle.Add(1)
		go func(c net.Conn, stop <-chan struct{}) {
			defer trickle.Done()
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
		}(c, stop[i])
	}
	stopped := make([]bool, len(slow))
	stopTrickle := func(i int) {
		if !stopped[i] {
			stopped[i] = true
			close(stop[i])
		}
	}
	t.Cleanup(func() {
		for i := range slow {
			stopTrickle(i)
		}
		trickle.Wait()
	})
	// nginx counts a request in limit_conn once it has read its headers, and stub_status counts
	// it as "Writing" just before that: wait for the eight (and the status request itself).
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
	res, body := rawExchange(t, e.addr, "POST /v1/sales/s1/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	if res.StatusCode != 429 || res.Header.Get("Content-Type") != "application/json" || !strings.Contains(string(body), `"code":"rate_limited"`) {
		t.Fatalf("a ninth purchase in flight from one address: %d %q %s", res.StatusCode, res.Header.Get("Content-Type"), body)
	}
	// The server-wide per-IP limit (32) is not what refused it: a GET still passes.
	if r := do(t, "GET", e.base+"/v1/sales/s1/orders/1", "", nil, nil); r.Status != 202 {
		t.Fatalf("a GET beside eight slow bodies: %d %s", r.Status, r.Raw)
	}
	// None of the eight was refused in the ninth's place: each is still open, nothing answered.
	for i, c := range slow {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		var b [64]byte
		n, err := c.Read(b[:])
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("slow body %d ended before its timeout: %q %v", i, b[:n], err)
		}
	}
	// The stalled bodies are cut by client_body_timeout: the connection ends (408 is not sent
	// with reset_timedout_connection: a reset or EOF).
	stopTrickle(0)
	c := slow[0]
	_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
	start := time.Now()
	_, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a stalled body still open after %v", time.Since(start))
	}
	// The ninth purchase never reached the gateway. The slow bodies do, as they come (nginx
	// does not buffer a purchase's body, so that the gateway's read_timeout bounds it): at most
	// the eight.
	slowSeen := 0
	for len(u.requests) > 0 {
		switch r := <-u.requests; {
		case r.Method == "GET":
		case r.ContentLength == slowBodyLen:
			slowSeen++
		default:
			t.Fatalf("%s %s (Content-Length %d) reached the gateway", r.Method, r.URL, r.ContentLength)
		}
	}
	if slowSeen > len(slow) {
		t.Fatalf("%d slow bodies reached the gateway, want at most %d", slowSeen, len(slow))
	}
}
