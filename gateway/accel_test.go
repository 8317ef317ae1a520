package gateway

import (
	"strconv"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/flashgate/flashgate"
)

// TestOnlySoldOutIsCacheable: nginx keeps an answer only when it carries
// X-Accel-Expires (nginx/nginx.conf), so the gateway sets it on the sold-out
// 409 alone, as "@<the current unix second>": a copy lives to the end of the
// second, never past a restock by a second. A 202, a refusal over the
// per-user limit and a 409 that is not the sold-out mark carry none.
func TestOnlySoldOutIsCacheable(t *testing.T) {
	e := start(t)
	s := e.sale(func(s *flashgate.Sale) { s.Total, s.PerUserLimit, s.PerOrderMax = 3, 2, 2 })
	path := []byte("/v1/sales/" + s.ID + "/orders")
	send := func(user, body string) *fasthttp.RequestCtx {
		t.Helper()
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod(fasthttp.MethodPost)
		ctx.Request.SetRequestURIBytes(path)
		ctx.Request.Header.Set("Authorization", "Bearer "+e.token(user))
		ctx.Request.SetBodyString(body)
		e.g.handle(&ctx)
		return &ctx
	}
	expires := func(ctx *fasthttp.RequestCtx) string {
		return string(ctx.Response.Header.Peek("X-Accel-Expires"))
	}
	for _, c := range []struct {
		user, body string
		status     int
	}{
		{"a", `{"quantity":2}`, 202},
		{"a", `{"quantity":1}`, 403}, // the per-user limit
		{"b", `{"quantity":2}`, 409}, // one unit left, two asked: sold out for b, not for everyone
	} {
		ctx := send(c.user, c.body)
		if ctx.Response.StatusCode() != c.status || expires(ctx) != "" {
			t.Fatalf("%s %s: %d %s, X-Accel-Expires %q: want %d and no X-Accel-Expires",
				c.user, c.body, ctx.Response.StatusCode(), ctx.Response.Body(), expires(ctx), c.status)
		}
	}
	if ctx := send("c", `{"quantity":1}`); ctx.Response.StatusCode() != 202 {
		t.Fatalf("last unit: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	before := time.Now().Unix()
	ctx := send("d", `{"quantity":1}`)
	after := time.Now().Unix()
	if ctx.Response.StatusCode() != 409 || responseCode(ctx) != flashgate.CodeSoldOut {
		t.Fatalf("after the last unit: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	v := expires(ctx)
	sec, err := strconv.ParseInt(v[min(1, len(v)):], 10, 64)
	if len(v) < 2 || v[0] != '@' || err != nil || sec < before || sec > after {
		t.Fatalf("sold-out 409: X-Accel-Expires %q, want \"@<unix second>\" between %d and %d", v, before, after)
	}
}

// TestRegionSoldOutIsNotCacheable: nginx keys its sold-out copy by the sale's
// path alone (never the body, which names the region), so a region sold out
// while another has stock must not carry X-Accel-Expires: kept, it would answer
// the other region's buyers 409. Once every region is sold out, it does.
func TestRegionSoldOutIsNotCacheable(t *testing.T) {
	e := start(t)
	s := e.sale(func(s *flashgate.Sale) {
		s.Total, s.PerUserLimit, s.PerOrderMax = 2, 1, 1
		s.Regions = map[string]int64{"bj": 1, "sh": 1}
	})
	buy := func(user, region string) (int, string) {
		t.Helper()
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod(fasthttp.MethodPost)
		ctx.Request.SetRequestURI("/v1/sales/" + s.ID + "/orders")
		ctx.Request.Header.Set("Authorization", "Bearer "+e.token(user))
		ctx.Request.SetBodyString(`{"region":"` + region + `"}`)
		e.g.handle(&ctx)
		return ctx.Response.StatusCode(), string(ctx.Response.Header.Peek("X-Accel-Expires"))
	}
	if st, _ := buy("a", "bj"); st != 202 {
		t.Fatalf("last bj unit: %d", st)
	}
	for _, u := range []string{"b", "c"} { // the admission's sold out, then the mark's
		if st, x := buy(u, "bj"); st != 409 || x != "" {
			t.Fatalf("bj sold out, sh not: %d, X-Accel-Expires %q: want 409 and none", st, x)
		}
	}
	if st, _ := buy("d", "sh"); st != 202 {
		t.Fatalf("last sh unit: %d", st)
	}
	if st, x := buy("e", "sh"); st != 409 || len(x) < 2 || x[0] != '@' {
		t.Fatalf("every region sold out: %d, X-Accel-Expires %q: want 409 and \"@<unix second>\"", st, x)
	}
}

// TestTrailingSlashIsNoRoute: …/orders/ is not the purchase route (nginx's
// orders location, its limits and its sold-out answers, match …/orders only),
// nor is …/{sale}/ the sale: 404 invalid_request, nothing reserved.
func TestTrailingSlashIsNoRoute(t *testing.T) {
	e := start(t)
	s := e.sale(func(s *flashgate.Sale) { s.Total = 5 })
	for _, c := range []struct{ method, path string }{
		{"POST", "/v1/sales/" + s.ID + "/orders/"},
		{"GET", "/v1/sales/" + s.ID + "/"},
		{"POST", "/v1/sales/" + s.ID + "/orders//"},
	} {
		r := e.do(c.method, c.path, e.token("slash"), []byte(`{"quantity":1}`), nil)
		if r.Status != 404 || r.Code != string(flashgate.CodeInvalidRequest) {
			t.Errorf("%s %s: %d %s, want 404 invalid_request", c.method, c.path, r.Status, r.Raw)
		}
	}
	if rem, resv := e.stock(s); rem != 5 || resv != 0 {
		t.Errorf("remaining %d, reservations %d: want 5 and none", rem, resv)
	}
}
