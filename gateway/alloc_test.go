package gateway

import (
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/config"
)

// TestRefusalsFromMemoryDoNotAllocate: with every rate limit on (with room)
// and the token cached, a purchase refused without I/O allocates nothing:
// refused by the sold-out mark before the token (soldOutEarly), and refused
// after every pre-validation step by the sale's start time (purchaseRegion,
// idempotencyKey, the user limit, saleOpen). Counted in a build without
// -race (make bench's, and go test without -race), whose instrumentation
// allocates on its own.
func TestRefusalsFromMemoryDoNotAllocate(t *testing.T) {
	e := start(t, func(c *config.Config) {
		c.RateLimit = config.RateLimit{
			PerIP: config.Rate{Rate: 1e9, Burst: 1e9}, PerUser: config.Rate{Rate: 1e9, Burst: 1e9},
			PerSale: config.Rate{Rate: 1e9, Burst: 1e9}, MaxInflight: 1 << 20,
		}
	})
	soldOut := e.sale(func(s *flashgate.Sale) { s.Total, s.PerUserLimit, s.PerOrderMax = 1, 1, 1 })
	if r := e.buy(soldOut, e.token("first"), `{}`, nil); r.Status != 202 {
		t.Fatalf("first purchase: %d", r.Status)
	}
	notStarted := e.sale(func(s *flashgate.Sale) {
		s.StartsAt, s.EndsAt = time.Now().Add(time.Hour), time.Now().Add(2*time.Hour)
		s.Regions = map[string]int64{"bj": 5, "sh": 5}
	})
	auth := []byte("Bearer " + e.token("alloc"))
	for _, c := range []struct {
		name string
		sale *flashgate.Sale
		body string
		want int
	}{
		{"sold out from the mark", soldOut, `{"quantity":1}`, 409},
		{"not started, after every check", notStarted, `{"quantity":1,"region":"sh"}`, 425},
	} {
		path := []byte("/v1/sales/" + c.sale.ID + "/orders")
		body := []byte(c.body)
		var ctx fasthttp.RequestCtx
		req := func() {
			ctx.Request.Reset()
			ctx.Response.Reset()
			ctx.Request.Header.SetMethod(fasthttp.MethodPost)
			ctx.Request.SetRequestURIBytes(path)
			ctx.Request.Header.SetBytesV("Authorization", auth)
			ctx.Request.SetBodyRaw(body)
			e.g.handle(&ctx)
		}
		req() // the token is verified once, then cached
		if got := ctx.Response.StatusCode(); got != c.want {
			t.Fatalf("%s: status %d (%s), want %d", c.name, got, ctx.Response.Body(), c.want)
		}
		if raceBuild {
			continue // the status was checked; counts hold only without -race
		}
		if a := testing.AllocsPerRun(500, req); a != 0 {
			t.Errorf("%s: %.1f allocations per request, want 0", c.name, a)
		}
	}
}
