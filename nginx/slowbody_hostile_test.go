//go:build hostile

package nginx_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// This test runs with `make hostile` (go test -tags hostile), beside the
// suite's slow-body attack, not in `make test`: with every package's tests at
// once on two cores, nginx counted the eight slow connections too late for it
// in some runs.

// TestSlowBodyPerIP: one address holding purchase bodies open gets no more than 8 of them in
// flight; the next purchase from it is a JSON 429 at once, and a body that stops arriving is cut
// at client_body_timeout (3 s) with the connection closed, never forwarded.
func TestSlowBodyPerIP(t *testing.T) {
	u := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(202) })
	e := startNginx(t, opts{gateways: []string{u.addr}, rate: 1000, burst: 1000})
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
		if _, err := io.WriteString(c, "POST /v1/sales/s1/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"); err != nil {
			t.Fatal(err)
		}
	}
	// The eight send a byte of body a second, so that client_body_timeout (3 s between reads)
	// does not cut them while the ninth is tried: on a loaded machine nginx may read their
	// headers, and so count them, only seconds after they were sent. slow[0] stops first: it
	// is the one whose cut is checked below.
	stop := make([]chan struct{}, len(slow))
	var trickle sync.WaitGroup
	for i, c := range slow {
		stop[i] = make(chan struct{})
		trickle.Add(1)
		go func(c net.Conn, stop <-chan struct{}) {
			defer trickle.Done()
			tick := time.NewTicker(time.Second)
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
	// nginx counts a connection once it has read the request's headers: wait until all eight
	// are counted, retrying the ninth until it is refused (or 20 s pass).
	var res *http.Response
	var body []byte
	for deadline := time.Now().Add(20 * time.Second); ; {
		res, body = rawExchange(t, e.addr, "POST /v1/sales/s1/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
		if res.StatusCode == 429 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if res.StatusCode != 429 || res.Header.Get("Content-Type") != "application/json" || !strings.Contains(string(body), `"code":"rate_limited"`) {
		t.Fatalf("a ninth purchase in flight from one address: %d %q %s", res.StatusCode, res.Header.Get("Content-Type"), body)
	}
	// The server-wide per-IP limit (32) is not what refused it: a GET still passes.
	if r := do(t, "GET", e.base+"/v1/sales/s1/orders/1", "", nil, nil); r.Status != 202 {
		t.Fatalf("a GET beside eight slow bodies: %d %s", r.Status, r.Raw)
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
	// (The ninth purchases sent before nginx had counted the eight may have passed; they carry a
	// 2-byte body, the stalled ones 100.)
	for len(u.requests) > 0 {
		if r := <-u.requests; r.ContentLength == 100 {
			t.Fatalf("a stalled body reached the gateway")
		}
	}
}
