package gateway

import (
	"bufio"
	"io"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/flashgate/flashgate/config"
)

// saleHits is how many GET sale requests the gateway has answered 200.
func (e *env) saleHits() string {
	e.t.Helper()
	m := regexp.MustCompile(`(?m)^flashgate_gateway_requests_total\{code="ok",route="sale"\} (\d+)`).FindStringSubmatch(e.metricsText())
	if m == nil {
		e.t.Fatal("no sale request counter")
	}
	return m[1]
}

// TestSmugglingIsRefused sends, on one raw connection, a request whose
// framing is ambiguous followed by a second request (a GET of a sale) that a
// lenient parser would run. Each must answer its status in JSON, close the
// connection, and never run the second request.
func TestSmugglingIsRefused(t *testing.T) {
	// A refusal must not wait for read_timeout (the client gives up at 5 s).
	e := start(t, func(c *config.Config) { c.Gateway.ReadTimeout = time.Minute })
	s := e.sale(nil)
	post := "POST /v1/sales/" + s.ID + "/orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + e.token("smuggler") + "\r\n"
	smuggled := "GET /v1/sales/" + s.ID + " HTTP/1.1\r\nHost: x\r\n\r\n"
	for _, c := range []struct {
		name, raw string
		status    int
	}{
		{"CL then TE", post + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
		{"TE then CL", post + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n", 400},
		// The chunked body never ends: refused without waiting for it.
		{"CL+TE, body held", post + "Content-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n100\r\nab", 400},
		{"space before colon", post + "Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n", 400},
		{"space before colon, CL", post + "Content-Length : 0\r\nContent-Length: 2\r\n\r\n{}", 400},
		{"obs-fold TE", post + "X-A: b\r\n Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n{}", 400},
		{"obs-fold value", post + "Transfer-Encoding:\r\n chunked\r\nContent-Length: 2\r\n\r\n{}", 400},
		{"two TE", post + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
		{"unknown TE", post + "Transfer-Encoding: gzip\r\n\r\n{}", 501},
		{"TE list", post + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501},
		{"conflicting CL", post + "Content-Length: 2\r\nContent-Length: 5\r\n\r\n{}", 400},
		{"HTTP/2.0", "GET /v1/sales/" + s.ID + " HTTP/2.0\r\nHost: x\r\n\r\n", 505},
		{"HTTP/1.2", "GET /v1/sales/" + s.ID + " HTTP/1.2\r\nHost: x\r\n\r\n", 505},
		{"HTTP/3", "GET /v1/sales/" + s.ID + " HTTP/3\r\nHost: x\r\n\r\n", 505},
		{"TE in HTTP/1.0", strings.Replace(post, "HTTP/1.1", "HTTP/1.0", 1) + "Connection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := e.saleHits()
			conn, err := net.Dial("tcp", e.g.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := conn.Write([]byte(c.raw + smuggled)); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			jsonRefusal(t, br, c.status, "invalid_request")
			// Nothing follows: the connection is closed, not kept for a
			// second request.
			if rest, err := io.ReadAll(br); len(rest) > 0 || err != nil {
				t.Fatalf("after the refusal: %q %v", rest, err)
			}
			if after := e.saleHits(); after != before {
				t.Fatalf("the smuggled request ran: sale requests %s -> %s", before, after)
			}
		})
	}
	// The counter moves for a request that is not smuggled: two pipelined GETs
	// on one connection both run.
	before := e.saleHits()
	br := bufioReader(t, e.g.Addr(), smuggled+smuggled)
	for i := 0; i < 2; i++ {
		res, err := readResponse(br)
		if err != nil || res != 200 {
			t.Fatalf("pipelined GET %d: %d %v", i, res, err)
		}
	}
	if after := e.saleHits(); after == before {
		t.Fatalf("sale requests counter did not move (%s)", after)
	}
}

func readResponse(br *bufio.Reader) (int, error) {
	var res fasthttp.Response
	if err := res.Read(br); err != nil {
		return 0, err
	}
	return res.StatusCode(), nil
}

func TestCheckFramingAllowsPlainRequests(t *testing.T) {
	for _, raw := range []string{
		"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n",
		"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n",
		"GET /x HTTP/1.0\r\n\r\n",
		"GET /x HTTP/1.1\r\nHost: x\r\nX-Spaces:   a b\t\r\n\r\n",
	} {
		var h fasthttp.RequestHeader
		if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		if st, msg := checkFraming(&h); st != 0 {
			t.Errorf("%q refused: %d %s", raw, st, msg)
		}
	}
}

// BenchmarkCheckFraming: the check runs on every request; it must not allocate.
func BenchmarkCheckFraming(b *testing.B) {
	var h fasthttp.RequestHeader
	raw := "POST /v1/sales/s1/orders HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n" +
		"Content-Type: application/json\r\nContent-Length: 14\r\nIdempotency-Key: 0123456789\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n"
	if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if st, _ := checkFraming(&h); st != 0 {
			b.Fatal(st)
		}
	}
	if a := testing.AllocsPerRun(100, func() { checkFraming(&h) }); a != 0 {
		b.Fatalf("%v allocations", a)
	}
}
