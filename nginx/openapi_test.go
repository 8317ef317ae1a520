package nginx_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/flashgate/flashgate/api"
)

// TestNginxAnswersMatchTheDocument: what nginx answers itself on the public API's paths is
// an answer api/openapi.yaml documents for that operation, body and headers (Retry-After)
// included, validated with kin-openapi as e2e.TestOpenAPIContract validates the gateway's. 414,
// 502 and 504 only nginx answers: this is where the document's are proved.
func TestNginxAnswersMatchTheDocument(t *testing.T) {
	release := make(chan struct{})
	inflight := make(chan struct{}, 1)
	held := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		inflight <- struct{}{}
		<-release
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	})
	dead := startNginx(t, opts{gateways: []string{freeAddr(t)}})                     // nobody listens: 502
	slow := startNginx(t, opts{gateways: []string{blackhole(t)}, readTimeout: "1s"}) // never answers: 504
	busy := startNginx(t, opts{gateways: []string{held.addr}, conn: 1})              // one request at a time

	const sale, orders = "/v1/sales/s1", "/v1/sales/s1/orders"
	for _, c := range []struct {
		name         string
		e            *edge
		method, path string
		raw          string
		status       int
	}{
		{"no gateway", dead, "GET", sale, "GET " + sale + " HTTP/1.1\r\nHost: x\r\n\r\n", 502},
		{"no gateway, purchase", dead, "POST", orders, "POST " + orders + " HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 502},
		{"silent gateway", slow, "POST", orders, "POST " + orders + " HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 504},
		{"huge URI", dead, "GET", "/v1/sales/" + strings.Repeat("u", 9000), "GET /v1/sales/" + strings.Repeat("u", 9000) + " HTTP/1.1\r\nHost: x\r\n\r\n", 414},
		{"huge header", dead, "GET", sale, "GET " + sale + " HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("y", 9000) + "\r\n\r\n", 431},
		{"64 KiB body", dead, "POST", orders, "POST " + orders + " HTTP/1.1\r\nHost: x\r\nContent-Length: 65536\r\n\r\n" + strings.Repeat("z", 64<<10), 413},
		{"CL+TE", dead, "POST", orders, "POST " + orders + " HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
		{"unknown TE", dead, "POST", orders, "POST " + orders + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
		{"HTTP/2.0 as HTTP/1", dead, "GET", sale, "GET " + sale + " HTTP/2.0\r\nHost: x\r\n\r\n", 505},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, body := rawExchange(t, c.e.addr, c.raw)
			if res.StatusCode != c.status {
				t.Fatalf("%d %s, want %d", res.StatusCode, body, c.status)
			}
			validateAnswer(t, c.e, c.method, c.path, res, body)
		})
	}

	t.Run("over the connection limit", func(t *testing.T) {
		first := make(chan error, 1)
		go func() {
			_, err := try("GET", busy.base+sale, "", nil, nil)
			first <- err
		}()
		select {
		case <-inflight:
		case <-time.After(10 * time.Second):
			t.Fatal("the upstream never got the first request")
		}
		res, body := rawExchange(t, busy.addr, "GET "+sale+" HTTP/1.1\r\nHost: x\r\n\r\n")
		close(release)
		if err := <-first; err != nil {
			t.Error(err)
		}
		if res.StatusCode != 429 {
			t.Fatalf("%d %s, want 429", res.StatusCode, body)
		}
		validateAnswer(t, busy, "GET", sale, res, body)
	})
}

// validateAnswer checks an answer of nginx e to method path against the operation of
// api/openapi.yaml it belongs to.
func validateAnswer(t *testing.T, e *edge, method, path string, res *http.Response, body []byte) {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(api.YAML())
	if err != nil {
		t.Fatal(err)
	}
	doc.Servers = openapi3.Servers{{URL: e.base}}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(method, e.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	route, params, err := router.FindRoute(req)
	if err != nil {
		t.Fatalf("%s %s: no operation of the document: %v", method, path, err)
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
		},
		Status: res.StatusCode, Header: res.Header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	in.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		t.Errorf("%s %s → %d %s: does not match api/openapi.yaml: %v", method, route.Path, res.StatusCode, body, err)
	}
}
