package gateway

import (
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/metrics"
)

// TestRetryAfterIsJitteredAndDerived: a 429's or 503's Retry-After is never
// below the wait that caused it (rounded up, at least 1 s), never above 30 s,
// and spread: buyers refused together are not all sent back at one second.
func TestRetryAfterIsJitteredAndDerived(t *testing.T) {
	for _, c := range []struct {
		wait   time.Duration
		lo, hi int64
	}{
		{0, 1, 3},
		{-time.Second, 1, 3},
		{300 * time.Millisecond, 1, 3},
		{1200 * time.Millisecond, 2, 5},
		{10 * time.Second, 10, 21},
		{29 * time.Second, 29, 30},
		{time.Hour, 30, 30},
	} {
		seen := map[int64]bool{}
		for range 300 {
			s := retryAfter(c.wait)
			if s < c.lo || s > c.hi {
				t.Fatalf("retryAfter(%v) = %d, want %d..%d", c.wait, s, c.lo, c.hi)
			}
			seen[s] = true
		}
		if want := min(c.hi-c.lo+1, 3); int64(len(seen)) < want {
			t.Errorf("retryAfter(%v): %d distinct values in 300 draws (%v), want at least %d", c.wait, len(seen), seen, want)
		}
	}
}

// TestRateLimitedRetryAfterFromTheLimiter: a buyer over the per-user rate
// (one purchase per 15 s) is told to come back no sooner than the limiter
// allows, at seconds that differ from one refusal to the next, never the old
// constant 1.
func TestRateLimitedRetryAfterFromTheLimiter(t *testing.T) {
	e := start(t, func(c *config.Config) {
		c.RateLimit.PerUser = config.Rate{Rate: 1.0 / 15, Burst: 1}
	})
	s := e.sale(nil)
	tok := e.token("hasty")
	if r := e.buy(s, tok, `{}`, nil); r.Status != 202 {
		t.Fatalf("first purchase: %d %s", r.Status, r.Raw)
	}
	seen := map[int]bool{}
	for range 30 {
		r := e.buy(s, tok, `{}`, nil)
		if r.Status != 429 || r.Code != "rate_limited" {
			t.Fatalf("over the rate: %d %s", r.Status, r.Raw)
		}
		secs, err := strconv.Atoi(r.RetryAfter)
		// The limiter's wait is under 15 s by the time taken since the first
		// purchase; 5 s leaves that all the room it could need.
		if err != nil || secs < 5 || secs > maxRetryAfter {
			t.Fatalf("Retry-After %q, want the limiter's wait (about 15 s) plus jitter, at most %d", r.RetryAfter, maxRetryAfter)
		}
		seen[secs] = true
	}
	if len(seen) < 2 {
		t.Errorf("30 refusals all said Retry-After %v: not jittered", seen)
	}
}

// TestOpenBreakerRetryAfterIsItsRemainingTime: an open breaker knows how long
// it stays open, and a purchase it refuses is told to come back no sooner.
func TestOpenBreakerRetryAfterIsItsRemainingTime(t *testing.T) {
	const open = 20 * time.Second
	b := newBreakers(2, open, metrics.NewGateway())
	cb := b.forSlot(0)
	if d := cb.retryIn(time.Now()); d != 0 {
		t.Fatalf("closed breaker: retryIn %v, want 0", d)
	}
	down := errors.New("dependency down")
	for range 2 {
		_, _ = cb.Execute(func() (struct{}, error) { return struct{}{}, down })
	}
	if d := cb.retryIn(time.Now()); d <= 0 || d > open {
		t.Fatalf("open breaker: retryIn %v, want in (0, %v]", d, open)
	}
	if d := cb.retryIn(time.Now().Add(open)); d != 0 {
		t.Fatalf("past its opening: retryIn %v, want 0", d)
	}

	// Through the gateway: a purchase on a shard whose breaker is open.
	e := start(t, func(c *config.Config) { c.Gateway.BreakerFailures, c.Gateway.BreakerOpen = 1, open })
	s := e.sale(nil)
	gs := e.g.sales.get([]byte(s.ID))
	_, _ = e.g.breakers.forSlot(gs.slotOf("late")).Execute(func() (struct{}, error) { return struct{}{}, down })
	r := e.buy(s, e.token("late"), `{}`, nil)
	secs, err := strconv.Atoi(r.RetryAfter)
	if r.Status != 503 || r.Code != "unavailable" || err != nil {
		t.Fatalf("breaker open: %d %s Retry-After %q", r.Status, r.Raw, r.RetryAfter)
	}
	// The breaker has most of its 20 s left; 10 leaves room for a slow host.
	if secs < 10 || secs > maxRetryAfter {
		t.Fatalf("breaker open for about %v: Retry-After %d, want at least 10 and at most %d", open, secs, maxRetryAfter)
	}
}

// TestLimitReachedNamesItsDimension: the 403 body carries the limit's
// dimension as a field: per_user_limit is "user", a purchase limit its own.
func TestLimitReachedNamesItsDimension(t *testing.T) {
	e := start(t)
	s := e.sale(func(s *flashgate.Sale) {
		s.PerUserLimit, s.PerOrderMax = 5, 1
		s.Limits = []flashgate.Limit{{Dimension: flashgate.DimIP, Max: 1}}
	})
	plain := e.sale(func(s *flashgate.Sale) { s.PerUserLimit, s.PerOrderMax = 1, 1 })
	type body struct {
		Code, Message, Dimension string
	}
	for _, c := range []struct {
		name string
		sale *flashgate.Sale
		want string
	}{
		{"per_user_limit", plain, "user"},
		{"ip limit", s, "ip"},
	} {
		if r := e.buy(c.sale, e.token("first"), `{}`, nil); r.Status != 202 {
			t.Fatalf("%s: first purchase %d %s", c.name, r.Status, r.Raw)
		}
		buyer := "first"
		if c.want == "ip" {
			buyer = "second" // another user from the same address
		}
		r := e.buy(c.sale, e.token(buyer), `{}`, nil)
		var b body
		if err := json.Unmarshal(r.Raw, &b); err != nil || r.Status != 403 || b.Code != "limit_reached" || b.Dimension != c.want || b.Message == "" {
			t.Errorf("%s: %d %s, want 403 limit_reached with dimension %q", c.name, r.Status, r.Raw, c.want)
		}
	}
}

// TestLimitReachedDoesNotAllocate: the 403 is bytes written once per sale.
func TestLimitReachedDoesNotAllocate(t *testing.T) {
	s := newSale(&flashgate.Sale{ID: "a", Total: 1, PerUserLimit: 2, PerOrderMax: 1,
		StartsAt: time.Now(), EndsAt: time.Now().Add(time.Hour),
		Limits: []flashgate.Limit{{Dimension: flashgate.DimPhone, Max: 1, Of: flashgate.OfUnits, Per: flashgate.PerSale}}})
	var ctx fasthttp.RequestCtx
	for _, c := range []struct {
		limit int
		want  string
	}{{-1, "user"}, {0, "phone"}, {7, "user"}} {
		limitReached(&ctx, s.limitBody(c.limit))
		var b struct{ Code, Message, Dimension string }
		if err := json.Unmarshal(ctx.Response.Body(), &b); err != nil || ctx.Response.StatusCode() != 403 ||
			b.Code != "limit_reached" || b.Dimension != c.want || b.Message == "" {
			t.Errorf("limit %d: %d %s, want 403 limit_reached dimension %q", c.limit, ctx.Response.StatusCode(), ctx.Response.Body(), c.want)
		}
		if got := responseCode(&ctx); got != flashgate.CodeLimitReached {
			t.Errorf("limit %d: counted as %q", c.limit, got)
		}
	}
	if raceBuild {
		return
	}
	if a := testing.AllocsPerRun(500, func() { limitReached(&ctx, s.limitBody(0)) }); a != 0 {
		t.Errorf("limit_reached: %.1f allocations per answer, want 0", a)
	}
	if a := testing.AllocsPerRun(500, func() { unavailable(&ctx, "stock service unavailable") }); a != 0 {
		t.Errorf("unavailable: %.1f allocations per answer, want 0", a)
	}
}

// TestRateLimitedDoesNotAllocate: a purchase refused 429 by the per-user rate,
// its jittered Retry-After included, allocates nothing once its token is
// cached. Counted without -race, like TestRefusalsFromMemoryDoNotAllocate.
func TestRateLimitedDoesNotAllocate(t *testing.T) {
	e := start(t, func(c *config.Config) {
		c.RateLimit.PerIP = config.Rate{Rate: 1e9, Burst: 1e9}
		c.RateLimit.PerUser = config.Rate{Rate: 0.001, Burst: 1}
	})
	s := e.sale(nil)
	tok := e.token("flood")
	if r := e.buy(s, tok, `{}`, nil); r.Status != 202 {
		t.Fatalf("first purchase: %d %s", r.Status, r.Raw)
	}
	path := []byte("/v1/sales/" + s.ID + "/orders")
	auth := []byte("Bearer " + tok)
	body := []byte(`{}`)
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
	req()
	if got := ctx.Response.StatusCode(); got != 429 || len(ctx.Response.Header.Peek("Retry-After")) == 0 {
		t.Fatalf("status %d (%s), want 429 with Retry-After", got, ctx.Response.Body())
	}
	if raceBuild {
		return
	}
	if a := testing.AllocsPerRun(500, req); a != 0 {
		t.Errorf("429: %.1f allocations per request, want 0", a)
	}
}
