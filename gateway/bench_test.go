package gateway

import (
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/config"
)

// benchPurchase drives the handler directly (no sockets), in parallel, so the
// figures are the gateway's own cost plus its Redis and JetStream round trips.
func benchPurchase(b *testing.B, e *env, sale *flashgate.Sale, token string, want int) {
	b.Helper()
	path := []byte("/v1/sales/" + sale.ID + "/orders")
	auth := []byte("Bearer " + token)
	body := []byte(`{"quantity":1}`)
	b.ReportAllocs()
	// Many requests in flight, as in a flood: the I/O cases are round-trip bound.
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var ctx fasthttp.RequestCtx
		for pb.Next() {
			ctx.Request.Reset()
			ctx.Response.Reset()
			ctx.Request.Header.SetMethod(fasthttp.MethodPost)
			ctx.Request.SetRequestURIBytes(path)
			ctx.Request.Header.SetBytesV("Authorization", auth)
			ctx.Request.SetBodyRaw(body)
			e.g.handle(&ctx)
			if got := ctx.Response.StatusCode(); got != want {
				b.Errorf("status %d (%s), want %d", got, ctx.Response.Body(), want)
				return
			}
		}
	})
}

// BenchmarkPurchaseBadToken: a refusal that needs no I/O (401).
func BenchmarkPurchaseBadToken(b *testing.B) {
	e := start(b)
	benchPurchase(b, e, e.sale(nil), "not.a.token", 401)
}

// BenchmarkPurchaseSoldOut: JWT, pre-validation, the admission script answering sold out (409).
func BenchmarkPurchaseSoldOut(b *testing.B) {
	e := start(b)
	s := e.sale(func(s *flashgate.Sale) { s.Total, s.PerUserLimit, s.PerOrderMax = 1, 1, 1 })
	if r := e.buy(s, e.token("first"), `{}`, nil); r.Status != 202 {
		b.Fatalf("first purchase: %d", r.Status)
	}
	benchPurchase(b, e, s, e.token("bench"), 409)
}

// BenchmarkPurchaseAccepted: the whole purchase: admission, JetStream publish and ack (202).
func BenchmarkPurchaseAccepted(b *testing.B) {
	e := start(b)
	s := e.sale(func(s *flashgate.Sale) { s.Total, s.PerUserLimit, s.PerOrderMax = 1<<40, 1<<40, 1 })
	benchPurchase(b, e, s, e.token("bench"), 202)
}

// BenchmarkParsePurchase: the strict body parser.
func BenchmarkParsePurchase(b *testing.B) {
	body := []byte(`{"quantity":2,"region":"bj"}`)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := parsePurchase(body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPurchaseSoldOutFromMemory: the flood after a sell-out. Every limit
// is on (with room), the token is cached, the sold-out mark answers 409 from
// memory: the path wrk hits in `make bench-edge`. It must not allocate.
func BenchmarkPurchaseSoldOutFromMemory(b *testing.B) {
	e := start(b, func(c *config.Config) {
		c.RateLimit = config.RateLimit{
			PerIP: config.Rate{Rate: 1e9, Burst: 1e9}, PerUser: config.Rate{Rate: 1e9, Burst: 1e9},
			PerSale: config.Rate{Rate: 1e9, Burst: 1e9}, MaxInflight: 1 << 20,
		}
	})
	s := e.sale(func(s *flashgate.Sale) { s.Total, s.PerUserLimit, s.PerOrderMax = 1, 1, 1 })
	if r := e.buy(s, e.token("first"), `{}`, nil); r.Status != 202 {
		b.Fatalf("first purchase: %d", r.Status)
	}
	benchPurchase(b, e, s, e.token("bench"), 409)
}

// BenchmarkPurchaseRateLimited: a buyer over the per-user rate, answered 429
// with a jittered Retry-After from memory. It must not allocate.
func BenchmarkPurchaseRateLimited(b *testing.B) {
	e := start(b, func(c *config.Config) {
		c.RateLimit.PerIP = config.Rate{Rate: 1e9, Burst: 1e9}
		c.RateLimit.PerUser = config.Rate{Rate: 0.001, Burst: 1}
	})
	s := e.sale(nil)
	tok := e.token("bench")
	if r := e.buy(s, tok, `{}`, nil); r.Status != 202 {
		b.Fatalf("first purchase: %d", r.Status)
	}
	benchPurchase(b, e, s, tok, 429)
}
