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
