package gateway

import (
	"bytes"
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/orderid"
)

// mkID is the id node would make at at (docs/design.md §6).
func mkID(at time.Time, node, seq int) uint64 {
	return uint64(at.Sub(orderid.Epoch).Milliseconds())<<22 | uint64(node)<<12 | uint64(seq)
}

func TestPossibleID(t *testing.T) {
	now := time.Now()
	s := newSale(&flashgate.Sale{ID: "s", StartsAt: now.Add(-time.Hour), EndsAt: now.Add(time.Hour)})
	lane := newSale(&flashgate.Sale{ID: "l", StartsAt: now.Add(-time.Hour), EndsAt: now.Add(time.Hour), Degrade: flashgate.DegradeMySQL})
	ended := newSale(&flashgate.Sale{ID: "e", StartsAt: now.Add(-2 * time.Hour), EndsAt: now.Add(-time.Hour)})
	for _, c := range []struct {
		name string
		s    *sale
		id   uint64
		want bool
	}{
		{"a gateway's, in the window", s, mkID(now.Add(-time.Minute), 0, 0), true},
		{"the last gateway node", s, mkID(now, orderid.LeasedNodes-1, 4095), true},
		{"a lane node, no lane", s, mkID(now, orderid.LeasedNodes, 0), false},
		{"a lane node, a lane", lane, mkID(now, orderid.MaxNode, 0), true},
		{"within the margin before the start", s, mkID(now.Add(-time.Hour-idMargin/2), 1, 0), true},
		{"before the start", s, mkID(now.Add(-time.Hour-2*idMargin), 1, 0), false},
		{"within the margin of now", s, mkID(now.Add(idMargin/2), 1, 0), true},
		{"in the future", s, mkID(now.Add(2*idMargin), 1, 0), false},
		{"the top bit set", s, 1<<63 | mkID(now, 1, 0), false},
		{"after the end", ended, mkID(now.Add(-time.Hour+2*idMargin), 1, 0), false},
		{"before the end", ended, mkID(now.Add(-time.Hour-time.Minute), 1, 0), true},
	} {
		if got := possibleID(c.s, c.id, now); got != c.want {
			t.Errorf("%s: possibleID = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestRecordsDecide(t *testing.T) {
	now := time.Now()
	rebuilt := now.Add(-time.Minute)
	for _, c := range []struct {
		name    string
		id      uint64
		rebuilt time.Time
		want    bool
	}{
		{"newer than the rebuild", mkID(now, 3, 0), rebuilt, true},
		{"within the margin of the rebuild", mkID(rebuilt.Add(idMargin/2), 3, 0), rebuilt, false},
		{"older than the rebuild", mkID(rebuilt.Add(-time.Second), 3, 0), rebuilt, false},
		{"no rebuild known", mkID(now, 3, 0), time.Time{}, false},
		{"a lane's order", mkID(now, orderid.LeasedNodes, 0), rebuilt, false},
	} {
		if got := recordsDecide(c.id, c.rebuilt); got != c.want {
			t.Errorf("%s: recordsDecide = %v, want %v", c.name, got, c.want)
		}
	}
}

// stubBackend answers every order command with reply (a pay, a cancel, a
// get), on the real NATS, and counts them.
func stubBackend(t *testing.T, e *env, reply bus.OrderReply) *atomic.Int64 {
	t.Helper()
	var seen atomic.Int64
	nc := testenv.NATS(t)
	sub, err := bus.ServeCommands(nc, e.cfg.NATS, func(bus.OrderCommand) bus.OrderReply {
		seen.Add(1)
		return reply
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &seen
}

// stampRebuilt sets when the sale's tag was rebuilt, as backend/rebuild.go
// does (zero: the field goes, as on a tag no rebuild stamped).
func (e *env) stampRebuilt(s *flashgate.Sale, at time.Time) {
	e.t.Helper()
	k := lua.KeysFor(s.ID, s.RegionNames())
	cmd := e.rc.B().Hdel().Key(k.Meta).Field(lua.MetaRebuilt).Build()
	if !at.IsZero() {
		cmd = e.rc.B().Hset().Key(k.Meta).FieldValue().FieldValue(lua.MetaRebuilt, strconv.FormatInt(at.UnixMilli(), 10)).Build()
	}
	if err := e.rc.Do(context.Background(), cmd).Error(); err != nil {
		e.t.Fatal(err)
	}
}

// TestJunkOrderIDsAnsweredAtTheGateway: a GET, a cancel or a payment of an id
// that cannot be the caller's is answered 404 by the gateway, no backend
// asked; someone else's order and a made-up id get the same bytes. Only what
// the buyer's records cannot decide goes to a backend, someone else's order
// as much as a missing one.
func TestJunkOrderIDsAnsweredAtTheGateway(t *testing.T) {
	// The per-user budget is not what is tested here.
	e := start(t, func(c *config.Config) { c.RateLimit.PerUser = config.Rate{Rate: 1000, Burst: 1000} })
	s := e.sale(nil) // began a minute ago
	e.stampRebuilt(s, time.Now().Add(-40*time.Second))
	alice, bob := e.token("alice"), e.token("bob")
	r := e.buy(s, alice, `{}`, nil)
	if r.Status != 202 {
		t.Fatalf("purchase: %d %s", r.Status, r.Raw)
	}
	now := time.Now()
	seen := stubBackend(t, e, bus.OrderReply{Code: bus.ReplyOK, Status: "confirmed", Quantity: 1, CreatedAt: now, ExpiresAt: now.Add(time.Minute)})
	orders := "/v1/sales/" + s.ID + "/orders/"
	u := func(id uint64) string { return strconv.FormatUint(id, 10) }

	// The buyer's own order is read from Redis.
	if got := e.do("GET", orders+r.OrderID, alice, nil, nil); got.Status != 200 || got.OrderID != r.OrderID {
		t.Fatalf("the owner's GET: %d %s", got.Status, got.Raw)
	}
	var ref []byte
	for _, c := range []struct {
		name, id, token string
	}{
		{"made before the sale", u(mkID(s.StartsAt.Add(-time.Minute), 3, 1)), alice},
		{"made in the future", u(mkID(now.Add(time.Minute), 3, 1)), alice},
		{"a lane node on a sale without a lane", u(mkID(now.Add(-time.Second), orderid.LeasedNodes+2, 1)), alice},
		{"made up, newer than the rebuild", u(mkID(now.Add(-time.Second), 7, 99)), alice},
		{"alice's, asked by bob", r.OrderID, bob},
	} {
		for _, op := range []struct{ method, suffix string }{{"GET", ""}, {"POST", "/cancel"}} {
			got := e.do(op.method, orders+c.id+op.suffix, c.token, nil, nil)
			if got.Status != 404 || got.Code != string(flashgate.CodeOrderNotFound) {
				t.Fatalf("%s %s: %d %s", op.method, c.name, got.Status, got.Raw)
			}
			if ref == nil {
				ref = got.Raw
			}
			if !bytes.Equal(got.Raw, ref) {
				t.Fatalf("%s %s: %s, unlike %s: the answer tells the two apart", op.method, c.name, got.Raw, ref)
			}
		}
	}
	// A signed payment of an id no node of the sale makes.
	body := `{"order_id":"` + u(mkID(now, orderid.LeasedNodes+1, 1)) + `","sale_id":"` + s.ID + `","payment_id":"pi_1","amount_cents":100}`
	hdr := map[string]string{auth.PaymentHeader: auth.PaymentSignature(e.cfg.Payments.Secret, time.Now(), []byte(body))}
	if got := e.do("POST", "/v1/payments", "", []byte(body), hdr); got.Status != 404 || got.Code != string(flashgate.CodeOrderNotFound) {
		t.Fatalf("payment of an impossible id: %d %s", got.Status, got.Raw)
	}
	if n := seen.Load(); n != 0 {
		t.Fatalf("a backend was asked %d times about ids the gateway can answer", n)
	}

	// What the records cannot decide goes on: ids older than the last
	// rebuild (someone else's known order alike), and any id while no
	// rebuild time is known.
	e.stampRebuilt(s, time.Now())
	older := u(mkID(time.Now().Add(-10*time.Second), 7, 100))
	for _, c := range []struct{ name, id, token string }{
		{"made up, older than the rebuild", older, bob},
		{"alice's, asked by bob, older than the rebuild", r.OrderID, bob},
	} {
		before := seen.Load()
		if got := e.do("GET", orders+c.id, c.token, nil, nil); got.Status != 200 || seen.Load() != before+1 {
			t.Fatalf("GET %s: %d %s; backend asked %d times", c.name, got.Status, got.Raw, seen.Load()-before)
		}
		if got := e.do("POST", orders+c.id+"/cancel", c.token, nil, nil); got.Status != 200 || seen.Load() != before+2 {
			t.Fatalf("cancel %s: %d %s; backend asked %d times", c.name, got.Status, got.Raw, seen.Load()-before)
		}
	}
	e.stampRebuilt(s, time.Time{})
	before := seen.Load()
	if got := e.do("GET", orders+u(mkID(time.Now(), 7, 101)), bob, nil, nil); got.Status != 200 || seen.Load() != before+1 {
		t.Fatalf("GET with no rebuild time: %d %s; backend asked %d times", got.Status, got.Raw, seen.Load()-before)
	}
}

// TestOrderReadsLimitedPerUser: GET of an order is limited per buyer
// (ratelimit.per_user_view): past it, 429 rate_limited with a Retry-After,
// and another buyer is not held back.
func TestOrderReadsLimitedPerUser(t *testing.T) {
	e := start(t, func(c *config.Config) { c.RateLimit.PerUserView = config.Rate{Rate: 0.5, Burst: 2} })
	s := e.sale(nil)
	e.stampRebuilt(s, time.Now().Add(-40*time.Second))
	alice, bob := e.token("alice"), e.token("bob")
	r := e.buy(s, alice, `{}`, nil)
	if r.Status != 202 {
		t.Fatalf("purchase: %d %s", r.Status, r.Raw)
	}
	path := "/v1/sales/" + s.ID + "/orders/" + r.OrderID
	for i := range 2 {
		if got := e.do("GET", path, alice, nil, nil); got.Status != 200 {
			t.Fatalf("GET %d: %d %s", i, got.Status, got.Raw)
		}
	}
	got := e.do("GET", path, alice, nil, nil)
	if got.Status != 429 || got.Code != string(flashgate.CodeRateLimited) {
		t.Fatalf("GET over the limit: %d %s", got.Status, got.Raw)
	}
	if ra, err := strconv.Atoi(got.RetryAfter); err != nil || ra < 1 {
		t.Fatalf("GET over the limit: Retry-After %q", got.RetryAfter)
	}
	// A made-up id counts too (the limit comes before any lookup).
	if got := e.do("GET", "/v1/sales/"+s.ID+"/orders/"+strconv.FormatUint(mkID(time.Now(), 1, 1), 10), alice, nil, nil); got.Status != 429 {
		t.Fatalf("a made-up id over the limit: %d %s", got.Status, got.Raw)
	}
	if got := e.do("GET", path, bob, nil, nil); got.Status != 404 {
		t.Fatalf("bob's GET: %d %s", got.Status, got.Raw)
	}
	// Cancels are the per_user budget's, not this one's.
	if got := e.do("POST", path+"/cancel", bob, nil, nil); got.Status != 404 {
		t.Fatalf("bob's cancel: %d %s", got.Status, got.Raw)
	}
}

// TestBusyBackendAnswers503WithItsWait: a backend whose queue is full answers
// unavailable with the time to work it off; the gateway's 503 carries a
// Retry-After derived from it (jittered, never less).
func TestBusyBackendAnswers503WithItsWait(t *testing.T) {
	e := start(t)
	s := e.sale(nil)
	alice := e.token("alice")
	r := e.buy(s, alice, `{}`, nil)
	if r.Status != 202 {
		t.Fatalf("purchase: %d %s", r.Status, r.Raw)
	}
	stubBackend(t, e, bus.OrderReply{Code: string(flashgate.CodeUnavailable), Message: "order service busy; retry", RetryAfterMS: 4000})
	for range 5 {
		got := e.do("POST", "/v1/sales/"+s.ID+"/orders/"+r.OrderID+"/cancel", alice, nil, nil)
		ra, err := strconv.Atoi(got.RetryAfter)
		if got.Status != 503 || got.Code != string(flashgate.CodeUnavailable) || err != nil || ra < 4 || ra > 9 {
			t.Fatalf("cancel with a busy backend: %d %s, Retry-After %q (want 4-9)", got.Status, got.Raw, got.RetryAfter)
		}
	}
}

// TestImpossibleOrderIDsDoNotAllocate: a GET or a cancel of an id that
// cannot be an order of the sale is refused from memory, with no allocation
// (counted without -race, like TestRefusalsFromMemoryDoNotAllocate).
func TestImpossibleOrderIDsDoNotAllocate(t *testing.T) {
	e := start(t, func(c *config.Config) {
		c.RateLimit = config.RateLimit{
			PerIP: config.Rate{Rate: 1e9, Burst: 1e9}, PerUser: config.Rate{Rate: 1e9, Burst: 1e9},
			PerSale: config.Rate{Rate: 1e9, Burst: 1e9}, PerUserView: config.Rate{Rate: 1e9, Burst: 1e9}, MaxInflight: 1 << 20,
		}
	})
	s := e.sale(nil)
	auth := []byte("Bearer " + e.token("alloc"))
	id := strconv.FormatUint(mkID(s.StartsAt.Add(-time.Hour), 3, 1), 10)
	for _, c := range []struct{ method, path string }{
		{fasthttp.MethodGet, "/v1/sales/" + s.ID + "/orders/" + id},
		{fasthttp.MethodPost, "/v1/sales/" + s.ID + "/orders/" + id + "/cancel"},
	} {
		path := []byte(c.path)
		var ctx fasthttp.RequestCtx
		req := func() {
			ctx.Request.Reset()
			ctx.Response.Reset()
			ctx.Request.Header.SetMethod(c.method)
			ctx.Request.SetRequestURIBytes(path)
			ctx.Request.Header.SetBytesV("Authorization", auth)
			e.g.handle(&ctx)
		}
		req() // the token is verified once, then cached
		if got := ctx.Response.StatusCode(); got != 404 {
			t.Fatalf("%s %s: status %d (%s), want 404", c.method, c.path, got, ctx.Response.Body())
		}
		if raceBuild {
			continue
		}
		if a := testing.AllocsPerRun(500, req); a != 0 {
			t.Errorf("%s %s: %.1f allocations per request, want 0", c.method, c.path, a)
		}
	}
}
