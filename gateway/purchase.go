package gateway

// The purchase path, POST /v1/sales/{sale}/orders, in the order a request
// takes it. serve (framing.go) checks the request's framing and hands it to
// handle; from there every step is below, top to bottom:
//
//	handle, route    which endpoint; the sale from the in-memory cache
//	purchase         the funnel: the checks below, cheapest refusal first
//	allowIP          per-IP rate limit (before the signature: a flood's cheapest refusal)
//	soldOutEarly     the sold-out mark, answered before the token is verified
//	user             the bearer token
//	purchaseRegion   quantity and region against the sale (parsePurchase, body.go, reads the body)
//	charges          who the purchase is by and what it counts against the sale's limits
//	idempotencyKey   the Idempotency-Key header
//	                 (the per-user rate limit)
//	saleOpen         ended, not started, sold out; maybeReplay lets a possible replay by
//	                 (the per-sale rate limit, the in-flight cap)
//	admit            the Lua admission on the sale's Redis shard, behind its breaker
//	viaLane          (degrade: mysql, the shard away or the sale stale) the MySQL lane instead, degrade.go
//	answerAdmission  the script's outcome as the answer
//	publish          the order to JetStream: 202 once it is stored, else release and 503
//	replay           a repeated Idempotency-Key answers its first order
//
// Nothing before admit does I/O except maybeReplay (one read, only for a
// request with an Idempotency-Key on a sale marked sold out). The other
// endpoints routed here (the sale, an order, pay, cancel) are in handlers.go,
// the payment service's (POST /v1/payments) in payment.go;
// the process around them (start, refresh loops, events) is in gateway.go.

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/sony/gobreaker/v2"
	"github.com/valyala/fasthttp"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics"
	"github.com/flashgate/flashgate/orderid"
	"github.com/flashgate/flashgate/ratelimit"
)

var (
	prefixSales    = []byte("/v1/sales/")
	segOrders      = []byte("orders")
	bearer         = []byte("Bearer ")
	hdrIdem        = []byte("Idempotency-Key")
	hdrAuth        = []byte("Authorization")
	subPay, subCnc = []byte("pay"), []byte("cancel")
)

// handle routes /v1/sales/{sale}[/orders[/{order}[/pay|/cancel]]] and
// /v1/payments without allocating, and counts the answer by route and code.
func (g *Gateway) handle(ctx *fasthttp.RequestCtx) {
	route := g.route(ctx)
	code := responseCode(ctx)
	g.metrics.Request(route, code)
	if g.accessSample > 0 && rand.Float64() < g.accessSample {
		g.accessLog(ctx, route, code)
	}
}

func (g *Gateway) route(ctx *fasthttp.RequestCtx) metrics.Route {
	path := ctx.Path()
	if bytes.Equal(path, pathPayments) {
		if !ctx.IsPost() {
			g.methodNotAllowed(ctx)
		} else {
			g.payment(ctx)
		}
		return metrics.RoutePayment
	}
	// A trailing slash names no resource: …/orders/ is not …/orders. Routed as one, it would be
	// a purchase that nginx's orders location (its limits, its sold-out answers) never saw.
	if !bytes.HasPrefix(path, prefixSales) || path[len(path)-1] == '/' {
		fail(ctx, fasthttp.StatusNotFound, flashgate.CodeInvalidRequest, "no such route")
		return metrics.RouteOther
	}
	saleID, rest, _ := bytes.Cut(path[len(prefixSales):], []byte{'/'})
	s := g.sales.get(saleID)
	seg, rest, _ := bytes.Cut(rest, []byte{'/'})
	switch {
	case len(seg) == 0 && len(rest) == 0:
		if !ctx.IsGet() {
			g.methodNotAllowed(ctx)
		} else {
			g.getSale(ctx, s)
		}
		return metrics.RouteSale
	case bytes.Equal(seg, segOrders) && len(rest) == 0:
		if !ctx.IsPost() {
			g.methodNotAllowed(ctx)
		} else {
			g.purchase(ctx, s)
			if s != nil { // the live view's funnel and 202 latency (stats.go)
				code := responseCode(ctx)
				s.counts.Add(code)
				if code == flashgate.CodeAccepted {
					s.counts.Accepted(time.Since(ctx.Time()))
				}
			}
		}
		return metrics.RoutePurchase
	case bytes.Equal(seg, segOrders):
		orderID, action, _ := bytes.Cut(rest, []byte{'/'})
		switch {
		case len(action) == 0 && ctx.IsGet():
			g.getOrder(ctx, s, orderID)
			return metrics.RouteOrder
		case bytes.Equal(action, subPay) && ctx.IsPost():
			payForbidden(ctx, s)
			return metrics.RoutePay
		case bytes.Equal(action, subCnc) && ctx.IsPost():
			g.orderCommand(ctx, s, orderID, bus.CmdCancel)
			return metrics.RouteCancel
		}
		g.methodNotAllowed(ctx)
		return metrics.RouteOrder
	}
	fail(ctx, fasthttp.StatusNotFound, flashgate.CodeInvalidRequest, "no such route")
	return metrics.RouteOther
}

var codePrefix = []byte(`{"code":"`)

// responseCode reads the code back from the answer's body (every error body
// starts with it); a body without one is a plain 200.
func responseCode(ctx *fasthttp.RequestCtx) flashgate.Code {
	b := ctx.Response.Body()
	if !bytes.HasPrefix(b, codePrefix) {
		return metrics.CodeOK
	}
	b = b[len(codePrefix):]
	if i := bytes.IndexByte(b, '"'); i >= 0 {
		return flashgate.Code(unsafeString(b[:i]))
	}
	return metrics.CodeOK
}

func (g *Gateway) methodNotAllowed(ctx *fasthttp.RequestCtx) {
	fail(ctx, fasthttp.StatusMethodNotAllowed, flashgate.CodeInvalidRequest, "method not allowed")
}

// purchase is POST /v1/sales/{sale}/orders: what needs no I/O first (the
// per-IP limit before the signature check, as the cheapest refusal of a
// flood), the sold-out mark before the per-sale limit (a refusal from memory
// is not an admission), Redis last. Each step that refuses has answered.
func (g *Gateway) purchase(ctx *fasthttp.RequestCtx, s *sale) {
	now := g.now()
	if !g.allowIP(ctx, now) {
		return
	}
	// The sale's window and its limits' windows are Redis's clock's
	// (invariant 8): the gateway reads it through its measured skew, and
	// answers from memory only clear of the window's edges (saleOpen);
	// admit.lua decides by TIME.
	rnow := g.redisNow(now)
	if g.soldOutEarly(ctx, s, rnow) {
		return
	}
	claims, ok := g.user(ctx, now)
	if !ok {
		return
	}
	if s == nil {
		fail(ctx, fasthttp.StatusNotFound, flashgate.CodeSaleNotFound, "no such sale")
		return
	}
	body, err := parsePurchase(ctx.PostBody())
	if err != nil {
		fail(ctx, fasthttp.StatusBadRequest, flashgate.CodeInvalidRequest, err.Error())
		return
	}
	region, ok := purchaseRegion(ctx, s, body)
	if !ok {
		return
	}
	var charges []flashgate.Charge
	sub := flashgate.Subjects{User: claims.Subject}
	if len(s.spec.Limits) > 0 {
		if charges, err = g.charges(ctx, s, &sub, claims, body, rnow); err != nil {
			fail(ctx, fasthttp.StatusBadRequest, flashgate.CodeInvalidRequest, err.Error())
			return
		}
	}
	idem, ok := idempotencyKey(ctx)
	if !ok {
		return
	}
	if ok, wait := g.allowUser(claims.Subject, now); !ok {
		g.limited(ctx, metrics.LimitUser, "too many requests from your account", wait)
		return
	}
	if !g.saleOpen(ctx, s, region, claims.Subject, idem, rnow) {
		return
	}
	if ok, wait := g.allowSale(s, now); !ok {
		g.limited(ctx, metrics.LimitSale, "this sale is taking too many orders right now", wait)
		return
	}
	if !g.limits.Enter() {
		g.limited(ctx, metrics.LimitInflight, "the gateway is at capacity", 0)
		return
	}
	defer g.limits.Leave()
	g.metrics.InflightAdd(1)
	defer g.metrics.InflightAdd(-1)
	g.admit(ctx, s, &sub, body.Quantity, region, idem, rnow, charges)
}

// windowMargin is how far inside the window's edges (by Redis's clock, as the
// gateway reads it) the gateway answers not_started or ended from memory;
// closer to an edge the admission asks Redis, whose clock decides. It covers
// a skew not yet sampled up to the alert's threshold
// (flashgate_redis_clock_skew_seconds > 1s).
const windowMargin = time.Second

// redisNow is now, the gateway's clock, read as Redis's: less the skew last
// measured (lua.WatchSkew).
func (g *Gateway) redisNow(now time.Time) time.Time {
	return now.Add(-time.Duration(g.skew.Load()))
}

// allowIP applies the per-IP limit to the client's address (an IPv6 client
// by its /64), then, for an IPv6 client, the looser per-network one to its /48.
func (g *Gateway) allowIP(ctx *fasthttp.RequestCtx, now time.Time) bool {
	a := g.proxies.clientIP(ctx)
	k := ipKey(a)
	if ok, wait := g.limits.IP.Allow(ratelimit.KeyBytes(k[:]), now.UnixNano()); !ok {
		g.limited(ctx, metrics.LimitIP, "too many requests from your address", wait)
		return false
	}
	if n, ok := netKey(a); ok {
		if ok, wait := g.limits.Net.Allow(ratelimit.KeyBytes(n[:]), now.UnixNano()); !ok {
			g.limited(ctx, metrics.LimitIP, "too many requests from your network", wait)
			return false
		}
	}
	return true
}

// limited answers 429 for limit l, with a Retry-After drawn from the wait the
// limiter advised (retryAfter).
func (g *Gateway) limited(ctx *fasthttp.RequestCtx, l metrics.Limit, msg string, wait time.Duration) {
	g.metrics.Refused(l)
	refuseRetry(ctx, fasthttp.StatusTooManyRequests, flashgate.CodeRateLimited, msg, wait)
}

// soldOutEarly answers 409 from the sold-out mark before the token is checked:
// that a sale (or region) is sold out is public (GET /v1/sales/{id} says so),
// and in a flood most buyers are new tokens, each an HS256 verification the
// answer does not need. A request that could be a replay (it carries an
// Idempotency-Key) goes on to the full checks, and so does one to a sale with
// regions whose body names no region of it (the body of a sale without
// regions is not read here: sold out is the answer whatever it holds).
func (g *Gateway) soldOutEarly(ctx *fasthttp.RequestCtx, s *sale, now time.Time) bool {
	if s == nil || ctx.Request.Header.PeekBytes(hdrIdem) != nil {
		return false
	}
	nowMS := now.UnixMilli()
	if s.closed.Load() || nowMS >= s.endsMS || nowMS < s.startsMS {
		return false
	}
	region := ""
	if len(s.spec.Regions) > 0 {
		body, err := parsePurchase(ctx.PostBody())
		if err != nil || len(body.Region) == 0 {
			return false
		}
		if region = s.regionName(body.Region); region == "" {
			return false
		}
	}
	if f := s.soldOutFlag(region); f == nil || !f.Load() {
		return false
	}
	soldOut(ctx, s, now)
	return true
}

// user verifies the bearer token; on failure it has answered 401.
func (g *Gateway) user(ctx *fasthttp.RequestCtx, now time.Time) (*auth.Claims, bool) {
	h := ctx.Request.Header.PeekBytes(hdrAuth)
	if len(h) <= len(bearer) || !bytes.EqualFold(h[:len(bearer)], bearer) {
		fail(ctx, fasthttp.StatusUnauthorized, flashgate.CodeUnauthorized, "missing bearer token")
		return nil, false
	}
	c, err := g.auth.Verify(h[len(bearer):], now)
	if err != nil {
		fail(ctx, fasthttp.StatusUnauthorized, flashgate.CodeUnauthorized, "invalid token")
		return nil, false
	}
	return c, true
}

// purchaseRegion checks the quantity and the region against the sale and
// returns the sale's own copy of the region name ("" for a sale without
// regions). On false it has answered 400.
func purchaseRegion(ctx *fasthttp.RequestCtx, s *sale, body purchaseBody) (string, bool) {
	if body.Quantity < 1 || body.Quantity > s.spec.PerOrderMax {
		fail(ctx, fasthttp.StatusBadRequest, flashgate.CodeInvalidRequest,
			"quantity must be between 1 and "+strconv.FormatInt(s.spec.PerOrderMax, 10))
		return "", false
	}
	if len(s.spec.Regions) == 0 {
		if len(body.Region) > 0 {
			fail(ctx, fasthttp.StatusBadRequest, flashgate.CodeInvalidRequest, "unknown region: this sale has no regions")
			return "", false
		}
		return "", true
	}
	if len(body.Region) == 0 {
		fail(ctx, fasthttp.StatusBadRequest, flashgate.CodeInvalidRequest, "region is required for this sale")
		return "", false
	}
	region := s.regionName(body.Region)
	if region == "" {
		fail(ctx, fasthttp.StatusBadRequest, flashgate.CodeInvalidRequest, "unknown region")
		return "", false
	}
	return region, true
}

// Errors of a purchase's limit subjects; their texts are what clients see.
var (
	errBadPhone   = errors.New("the token's phone claim is not a phone number")
	errBadDevice  = errors.New("the token's device claim must be 1-64 characters of [A-Za-z0-9_.:-]")
	errBadAddress = errors.New("address must be at most 512 bytes and hold letters or digits")
)

// charges works out who the purchase is by, in each dimension the sale's
// limits count (into sub, whose User is set), and what it counts against each
// limit.
func (g *Gateway) charges(ctx *fasthttp.RequestCtx, s *sale, sub *flashgate.Subjects, claims *auth.Claims, body purchaseBody, now time.Time) ([]flashgate.Charge, error) {
	var ok bool
	if s.spec.Needs(flashgate.DimPhone) && claims.Phone != "" {
		if sub.Phone, ok = flashgate.NormalisePhone(claims.Phone); !ok {
			return nil, errBadPhone
		}
	}
	if s.spec.Needs(flashgate.DimDevice) && claims.Device != "" {
		if !flashgate.ValidDevice(claims.Device) {
			return nil, errBadDevice
		}
		sub.Device = claims.Device
	}
	if s.spec.Needs(flashgate.DimIP) {
		sub.IP = flashgate.IPSubject(g.proxies.clientIP(ctx))
	}
	if s.spec.Needs(flashgate.DimAddress) && len(body.Address) > 0 {
		if sub.Address, ok = flashgate.NormaliseAddress(string(body.Address)); !ok {
			return nil, errBadAddress
		}
	}
	return s.spec.Charges(*sub, body.Quantity, now, s.loc)
}

// idempotencyKey returns the request's Idempotency-Key ("" for none). On
// false it has answered 400.
func idempotencyKey(ctx *fasthttp.RequestCtx) (string, bool) {
	k := ctx.Request.Header.PeekBytes(hdrIdem)
	if k == nil {
		return "", true
	}
	if !flashgate.ValidIDBytes(k) {
		fail(ctx, fasthttp.StatusBadRequest, flashgate.CodeInvalidRequest,
			"Idempotency-Key must be 1-64 characters of [A-Za-z0-9_-]")
		return "", false
	}
	return string(k), true
}

// saleOpen answers from the cached sale what the admission would: ended,
// not started, sold out (a replay of an earlier Idempotency-Key still goes
// on, to be answered its first order). On false it has answered.
//
// now is Redis's clock as the gateway reads it (redisNow): the window is
// answered from memory only windowMargin clear of its edges, and decided by
// admit.lua, on Redis's own clock, nearer to them.
func (g *Gateway) saleOpen(ctx *fasthttp.RequestCtx, s *sale, region, user, idem string, now time.Time) bool {
	nowMS := now.UnixMilli()
	margin := windowMargin.Milliseconds()
	switch {
	case s.closed.Load() || nowMS >= s.endsMS+margin:
		fail(ctx, fasthttp.StatusGone, flashgate.CodeEnded, "the sale has ended")
		return false
	case s.paused.Load():
		paused(ctx)
		return false
	case nowMS < s.startsMS-margin:
		failRetry(ctx, statusTooEarly, flashgate.CodeNotStarted, "the sale has not started", ceilSeconds(s.startsMS-nowMS))
		return false
	case s.soldOutFlag(region).Load() && !g.maybeReplay(s, user, idem):
		soldOut(ctx, s, now)
		return false
	}
	return true
}

// maybeReplay decides whether a purchase on a sold-out sale must still reach
// the admission: only a replay of an Idempotency-Key used before (which
// answers its first order) does. One read, no script; if the read fails, the
// admission decides.
func (g *Gateway) maybeReplay(s *sale, user, idem string) bool {
	if idem == "" {
		return false
	}
	rctx, cancel := context.WithTimeout(context.Background(), g.cfg.Gateway.AdmitTimeout)
	defer cancel()
	known, err := lua.IdemKnown(rctx, g.rc, s.keys.Home(user), user, idem)
	return err != nil || known
}

// admit runs the admission on the sale's shard, behind that shard's breaker,
// and answers what it decided. sub is who the purchase is by: its facts
// travel with the order so that the backend can work its charges out again.
func (g *Gateway) admit(ctx *fasthttp.RequestCtx, s *sale, sub *flashgate.Subjects, qty int64, region, idem string, now time.Time, charges []flashgate.Charge) {
	if g.breakers.nats.State() == gobreaker.StateOpen {
		// Admitting would only reserve units the publish cannot carry.
		unavailableFor(ctx, "order queue unavailable", g.breakers.nats.retryIn(time.Now()))
		return
	}
	if g.laneFirst(s) && g.viaLane(ctx, s, sub, qty, region, idem, now) {
		return
	}
	lease := g.lease.Load()
	if !lease.Valid() {
		unavailable(ctx, "order ids unavailable")
		return
	}
	args := lua.AdmitArgs{
		User: sub.User, Quantity: qty, OrderID: lease.Next(), Now: now, IdemKey: idem, Region: region,
		PayBy: now.Add(g.cfg.PaymentTimeout), Charges: charges, Limits: s.spec.Limits,
		EncodedCharges: flashgate.EncodeCharges(charges),
	}
	var adm lua.Admission
	start := time.Now()
	cb := g.breakers.forSlot(s.slotOf(sub.User))
	_, err := cb.Execute(func() (struct{}, error) {
		actx, cancel := context.WithTimeout(context.Background(), g.cfg.Gateway.AdmitTimeout)
		defer cancel()
		var err error
		// On the buyer's home bucket; not promised before n replicas have
		// it when redis.wait_replicas is set (docs/recovery.md).
		adm, err = g.scripts.AdmitHeld(actx, g.rc, s.keys, args, g.cfg.WaitReplicas, g.cfg.WaitTimeout)
		return struct{}{}, err
	})
	if refusedByBreaker(err) {
		if !g.viaLane(ctx, s, sub, qty, region, idem, now) {
			unavailableFor(ctx, "stock service unavailable", cb.retryIn(time.Now()))
		}
		return
	}
	g.metrics.AdmitLatency(time.Since(start))
	if errors.Is(err, lua.ErrNotReplicated) || errors.Is(err, lua.ErrHoldLost) {
		// Redis ran the admission and answered: it is not to be promised.
		// Its release decides the answer, as after a failed publish: a
		// replay of the same key may have published and claimed the order
		// meanwhile, and then it lives (202); a 503 sent before the release
		// had answered could become that order.
		g.undoNow(ctx, s, &flashgate.Order{ID: args.OrderID, SaleID: s.spec.ID, UserID: sub.User, Region: region,
			Charges: args.EncodedCharges}, err)
		return
	}
	if err != nil {
		// Not the lane: Redis may yet run this admission (a stalled Redis
		// runs what it had read when it wakes), and the buyer would have two
		// orders. The undo releases it; the buyer's retry meets the open
		// breaker and goes to the lane.
		g.undoAdmit(s, sub.User, args.OrderID, region, args.EncodedCharges, err)
		unavailableFor(ctx, "stock service unavailable", cb.retryIn(time.Now()))
		return
	}
	g.answerAdmission(ctx, s, sub, &args, adm, lease)
}

// answerAdmission turns the script's outcome into the answer: an admitted
// order goes on to publish, every other outcome is answered here.
func (g *Gateway) answerAdmission(ctx *fasthttp.RequestCtx, s *sale, sub *flashgate.Subjects, a *lua.AdmitArgs, adm lua.Admission, lease *orderid.Lease) {
	switch adm.Outcome {
	case lua.Admitted:
		if failpointsBuilt && g.crashAfter.Load() > 0 && g.crashAfter.Add(-1) == 0 {
			slog.Error("failpoint: exiting between admission and publish", "sale", s.spec.ID, "order", a.OrderID)
			os.Exit(3)
		}
		if adm.Remaining <= 0 && len(s.keys.Buckets()) == 0 {
			// (A split sale's home bucket at 0 is not the sale at 0: its
			// next buyer gathers from the others. Its mark is set by a
			// sold-out answer, which has asked every bucket.)
			g.markSoldOut(s, a.Region)
		}
		// The order's created time is Redis's, as its record has it (the
		// gateway's clock decides nothing: invariant 8).
		created, expires := adm.At, a.PayBy
		if created.IsZero() {
			created = a.Now
		} else {
			expires = created.Add(a.PayBy.Sub(a.Now))
		}
		g.publish(ctx, s, &flashgate.Order{
			ID: a.OrderID, SaleID: s.spec.ID, UserID: a.User, Quantity: a.Quantity, Region: a.Region,
			CreatedAt: created, ExpiresAt: expires, IdemKey: a.IdemKey, Charges: a.EncodedCharges,
			Phone: sub.Phone, Device: sub.Device, IP: sub.IP, Address: sub.Address,
		})
	case lua.Replayed:
		g.replay(ctx, s, a.User, adm.OrderID)
	case lua.NotWarmed:
		g.askWarm(s)
		unavailable(ctx, "sale is warming up")
	case lua.NotStarted:
		failRetry(ctx, statusTooEarly, flashgate.CodeNotStarted, "the sale has not started", ceilSeconds(adm.Wait.Milliseconds()))
	case lua.Ended:
		fail(ctx, fasthttp.StatusGone, flashgate.CodeEnded, "the sale has ended")
	case lua.Paused:
		g.sales.setPaused(s.spec.ID, true)
		paused(ctx)
	case lua.BadQuantity:
		fail(ctx, fasthttp.StatusBadRequest, flashgate.CodeInvalidRequest, "quantity out of range")
	case lua.LimitReached:
		limitReached(ctx, s.limitBody(adm.Limit))
	case lua.SoldOut:
		if adm.Remaining > 0 {
			// Units are left, fewer than asked for: not a mark for everyone.
			fail(ctx, fasthttp.StatusConflict, flashgate.CodeSoldOut, "sold out")
			return
		}
		g.markSoldOut(s, a.Region)
		soldOut(ctx, s, a.Now)
	case lua.DuplicateID:
		slog.Error("order id already taken: the id source is broken", "sale", s.spec.ID, "order", a.OrderID, "node", lease.Node())
		unavailable(ctx, "order ids unavailable")
	}
}

// undoAdmit runs after an admission that failed on our side (a timeout, a
// broken connection): Redis may still have run it, so a 503 alone could leave
// a reservation behind. Release is idempotent and finds nothing if the
// admission never ran. It runs in the background so the 503 stays fast, and
// retries until Redis answers; if the gateway stops first the reservation, if any, is
// left to reconcile. A bounded pool does the background work (release.go).
func (g *Gateway) undoAdmit(s *sale, user string, id uint64, region, charges string, cause error) {
	slog.Warn("admission failed; undoing it", "sale", s.spec.ID, "order", id, "cause", cause)
	g.enqueueRelease(releaseJob{s: s, user: user, id: id, region: region, charges: charges, reason: flashgate.ReasonAdmitFailed})
}

// undoNow releases an admission Redis answered but that is not to be
// promised (lua.ErrNotReplicated, lua.ErrHoldLost) and answers by the
// release: claimed (a replay of its key published it, and a backend holds
// it) is a 202, released a 503. If Redis does not answer the release within
// a publish timeout, the release goes on in the background and the answer is
// 503 (docs/verification.md names this gap).
func (g *Gateway) undoNow(ctx *fasthttp.RequestCtx, s *sale, m *flashgate.Order, cause error) {
	slog.Warn("admission not promised; releasing it", "sale", s.spec.ID, "order", m.ID, "cause", cause)
	g.answerByRelease(ctx, s, m, flashgate.ReasonAdmitFailed, func() { unavailable(ctx, "stock service unavailable") })
}

// answerByRelease releases m and answers by that release: claimed (or
// decided) means the order lives, 202; released, refuse (a 503). A release
// Redis does not answer within a publish timeout goes on in the background
// and the answer is refuse's.
func (g *Gateway) answerByRelease(ctx *fasthttp.RequestCtx, s *sale, m *flashgate.Order, reason string, refuse func()) {
	rel, err := g.releaseUnpublished(s, m, reason)
	switch {
	case err != nil:
		slog.Warn("release failed; retrying in the background", "sale", s.spec.ID, "order", m.ID, "err", err)
		g.enqueueRelease(releaseJob{s: s, user: m.UserID, id: m.ID, region: m.Region, charges: m.Charges, reason: reason})
		refuse()
	case rel.Claimed || (rel.Status != "" && rel.Status != lua.StatusReleased):
		accepted(ctx, m.ID, flashgate.OrderPending)
	default:
		if rel.Released {
			g.restocked(s, m.Region)
		}
		refuse()
	}
}

// publish sends an admitted order to JetStream and answers 202 once it is
// stored. When the publish fails the reservation is released and the answer is
// 503 — unless the backend has claimed the order meanwhile, which proves the
// message did get through (its ack was what got lost): then it is a 202.
func (g *Gateway) publish(ctx *fasthttp.RequestCtx, s *sale, m *flashgate.Order) {
	start := time.Now()
	rid := requestID(ctx)
	// A duplicate is no fault of NATS: it is kept from the breaker.
	var dup error
	_, err := g.breakers.nats.Execute(func() (struct{}, error) {
		err := g.send(s, m, rid, true)
		if errors.Is(err, bus.ErrDuplicate) {
			dup = err
			return struct{}{}, nil
		}
		return struct{}{}, err
	})
	if err == nil && dup != nil {
		// The stream holds another order under this id (two generators on
		// one node id): this order is not in it, so no 202. The release
		// below answers 503 (or 202 if a replay of this very order stored
		// and claimed it meanwhile).
		slog.Error("order id already in the stream: the id source is broken", "sale", s.spec.ID, "order", m.ID)
		err = dup
	}
	if err == nil {
		g.metrics.PublishLatency(time.Since(start))
		accepted(ctx, m.ID, flashgate.OrderPending)
		ctx.Response.Header.SetBytesKV(hdrRequestID, ctx.Request.Header.PeekBytes(hdrRequestID))
		return
	}
	slog.Warn("publish failed; releasing", "sale", s.spec.ID, "order", m.ID, "err", err)
	// The answer is the release's: released means no order can come of the
	// message (the backend drops it when it lands late), claimed means one
	// did. So it is retried, for another publish timeout, until Redis
	// answers: a 503 sent while the release is still open could be overtaken
	// by the backend's claim. (Release is idempotent: a retry of one that ran
	// unanswered finds it done.)
	g.answerByRelease(ctx, s, m, flashgate.ReasonPublishFailed, func() {
		unavailableFor(ctx, "order queue unavailable", g.breakers.nats.retryIn(time.Now()))
	})
}

// releaseUnpublished releases the reservation of an order whose publish
// failed, retrying for up to another publish timeout while Redis does not
// answer.
func (g *Gateway) releaseUnpublished(s *sale, m *flashgate.Order, reason string) (rel lua.ReleaseResult, err error) {
	deadline := time.Now().Add(g.cfg.Gateway.PublishTimeout)
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		rctx, cancel := context.WithTimeout(context.Background(), g.cfg.Gateway.AdmitTimeout)
		rel, err = g.scripts.Release(rctx, g.rc, s.keys.Home(m.UserID), m.ID, m.Region, m.Charges, lua.ReleaseGateway, reason)
		cancel()
		if err == nil || time.Now().Add(wait).After(deadline) {
			return rel, err
		}
		time.Sleep(wait)
	}
}

// orderBufs are the buffers orders are encoded in: the NATS client has copied
// a message when the publish returns, so a buffer serves the next order.
var orderBufs = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// send publishes m, with the id of the request it came from (rid). first is
// the order's first publish (right after its admission), for which the
// stream's "duplicate" means the id belongs to another order
// (bus.ErrDuplicate); a replay's duplicate is its own earlier copy.
func (g *Gateway) send(s *sale, m *flashgate.Order, rid string, first bool) error {
	subject := s.subject.Load()
	if subject == nil {
		v := bus.OrderSubject(g.cfg.NATS, s.spec.ID)
		subject = &v
		s.subject.Store(subject)
	}
	pctx, cancel := context.WithTimeout(context.Background(), g.cfg.Gateway.PublishTimeout)
	defer cancel()
	buf := orderBufs.Get().(*[]byte)
	send := bus.SendOrder
	if first {
		send = bus.SendNewOrder
	}
	err := send(pctx, g.nc, *subject, m, *buf, rid)
	orderBufs.Put(buf)
	return err
}

// replay answers a repeated Idempotency-Key. A 202 must mean JetStream holds
// the order, so a replay of an order still pending republishes it (the same
// Nats-Msg-Id makes that a no-op when the first publish got through) and then
// claims it, which stops a failing first request from releasing it.
func (g *Gateway) replay(ctx *fasthttp.RequestCtx, s *sale, user string, id uint64) {
	rctx, cancel := context.WithTimeout(context.Background(), g.cfg.Gateway.AdmitTimeout)
	defer cancel()
	rec, ok, err := lua.Order(rctx, g.rc, s.keys.Home(user), id)
	if err != nil || !ok {
		unavailable(ctx, "order state unavailable")
		return
	}
	if rec.Status == lua.StatusReleased {
		// The 503 is final only once the release is on the replicas: one a
		// failover lost would bring the order back, pending, for a backend
		// to confirm (spec/admission.pml, BUG_REPLAY_NO_WAIT). So the replay
		// releases the order itself, waited (release.lua writes a released
		// record again), and answers by that release: a failover may have
		// brought it back, claimed (202) or pending (released now: 503).
		rel, err := g.releaseUnpublished(s, &flashgate.Order{ID: id, UserID: user, Region: rec.Region, Charges: rec.Charges},
			flashgate.ReasonPublishFailed)
		switch {
		case err == nil && rel.Claimed:
			accepted(ctx, id, flashgate.OrderPending)
			return
		case err == nil && rel.Status != "" && rel.Status != lua.StatusReleased:
			accepted(ctx, id, rel.Status.Public())
			return
		}
		unavailable(ctx, "order queue unavailable")
		return
	}
	// Under redis.wait_replicas a replay promises the key's order only once
	// the replicas have it, as its admission would have: the first request
	// may have been told 503 for want of them (lua.ErrNotReplicated).
	if g.cfg.WaitReplicas > 0 {
		wctx, cancel := context.WithTimeout(context.Background(), g.cfg.Gateway.AdmitTimeout+g.cfg.WaitTimeout)
		acked, err := lua.WaitRecord(wctx, g.rc, s.keys.Home(user), id, g.cfg.WaitReplicas, g.cfg.WaitTimeout)
		cancel()
		if err != nil || !acked {
			unavailable(ctx, "order not replicated")
			return
		}
	}
	switch rec.Status {
	case lua.StatusPending:
		m := rec
		m.FactsFromCharges(s.spec.Limits)
		if err := g.send(s, &m, requestID(ctx), false); err != nil {
			unavailable(ctx, "order queue unavailable")
			return
		}
		st, err := g.scripts.Claim(rctx, g.rc, s.keys.Home(user), []uint64{id})
		if err != nil || st[0] == lua.ClaimReleased || st[0] == lua.ClaimCold {
			unavailable(ctx, "order queue unavailable")
			return
		}
	}
	accepted(ctx, id, rec.Status.Public())
}
