package nginx_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRefusalsInJSON: every request nginx refuses itself, malformed or hostile, is answered in
// the API's {"code","message"} JSON with the right status (never nginx's HTML page, never a 500
// from a misrouted error page), and none of them reaches the gateway: the bytes after a
// CL+TE request must not run as a second request. Each case is written raw on its own socket.
func TestRefusalsInJSON(t *testing.T) {
	u := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	})
	e := startNginx(t, opts{gateways: []string{u.addr}})
	const orders = "/v1/sales/s1/orders"
	smuggled := "GET /v1/sales/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	for _, c := range []struct {
		name   string
		raw    string
		status int
		code   string
	}{
		{"malformed request line", "GARBAGE\r\n\r\n", 400, "invalid_request"},
		{"request line without version", "GET / HTTP/\r\nHost: x\r\n\r\n", 400, "invalid_request"},
		{"lowercase method", "get / HTTP/1.1\r\nHost: x\r\n\r\n", 400, "invalid_request"},
		{"OPTIONS *", "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", 400, "invalid_request"},
		{"NUL in the path", "GET /v1/sales/a%00b HTTP/1.1\r\nHost: x\r\n\r\n", 400, "invalid_request"},
		{"path above the root", "GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n", 400, "invalid_request"},
		{"HTTP/2.0 as HTTP/1", "GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505, "invalid_request"},
		{"HTTP/3.1", "GET / HTTP/3.1\r\nHost: x\r\n\r\n", 505, "invalid_request"},
		{"no Host in HTTP/1.1", "GET / HTTP/1.1\r\n\r\n", 400, "invalid_request"},
		{"huge header", "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("y", 9000) + "\r\n\r\n", 431, "invalid_request"},
		{"huge URI", "GET /" + strings.Repeat("u", 9000) + " HTTP/1.1\r\nHost: x\r\n\r\n", 414, "invalid_request"},
		{"CL+TE", "POST " + orders + " HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, 400, "invalid_request"},
		{"two TE", "POST " + orders + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, 400, "invalid_request"},
		{"TE identity", "POST " + orders + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\nContent-Length: 2\r\n\r\n{}" + smuggled, 501, "invalid_request"},
		{"unknown TE", "POST " + orders + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n" + smuggled, 501, "invalid_request"},
		{"space before colon", "POST " + orders + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\nContent-Length: 2\r\n\r\n{}" + smuggled, 400, "invalid_request"},
		{"two Content-Lengths", "POST " + orders + " HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 40\r\n\r\n{}" + smuggled, 400, "invalid_request"},
		{"64 KiB body", "POST " + orders + " HTTP/1.1\r\nHost: x\r\nContent-Length: 65536\r\n\r\n" + strings.Repeat("z", 64<<10), 413, "body_too_large"},
		{"unknown method", "BREW / HTTP/1.1\r\nHost: x\r\n\r\n", 405, "invalid_request"},
		{"POST to the page", "POST /index.html HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 405, "invalid_request"},
		{"no such file", "GET /nope.php HTTP/1.1\r\nHost: x\r\n\r\n", 404, "not_found"},
		{"error page asked directly", "GET /_err/400.json HTTP/1.1\r\nHost: x\r\n\r\n", 404, "not_found"},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, body := rawExchange(t, e.addr, c.raw)
			if res.StatusCode != c.status || res.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("got %d %q %q, want %d application/json", res.StatusCode, res.Header.Get("Content-Type"), body, c.status)
			}
			var j map[string]string
			if err := json.Unmarshal(body, &j); err != nil {
				t.Fatalf("body %q is not the API's JSON: %v", body, err)
			}
			if len(j) != 2 || j["code"] != c.code || j["message"] == "" {
				t.Fatalf("body %q: want exactly {\"code\":%q,\"message\":\"…\"}", body, c.code)
			}
		})
	}
	// Nothing above was a valid request for the gateway: neither the refused ones nor what a
	// smuggling attempt put after them.
	select {
	case r := <-u.requests:
		t.Fatalf("the gateway received %s %s", r.Method, r.URL)
	default:
	}
	if log := e.errorLog(); strings.Contains(log, "named location") || strings.Contains(log, "[alert]") || strings.Contains(log, "[emerg]") {
		t.Errorf("nginx's error log:\n%s", log)
	}
}

// rawExchange writes raw on a new connection (the server may answer and close before reading
// all of it) and reads one response.
func rawExchange(t testing.TB, addr, raw string) (*http.Response, []byte) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	done := make(chan error, 1)
	go func() {
		_, err := io.WriteString(c, raw)
		done <- err
	}()
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if err := <-done; err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("writing the request: %v", err)
	}
	return res, body
}
