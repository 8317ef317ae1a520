package gateway

import (
	"context"
	"log/slog"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics"
	"github.com/flashgate/flashgate/ratelimit"
)

func (g *Gateway) getSale(ctx *fasthttp.RequestCtx, s *sale) {
	if s == nil {
		fail(ctx, fasthttp.StatusNotFound, flashgate.CodeSaleNotFound, "no such sale")
		return
	}
	ctx.SetContentTypeBytes(ctJSON)
	ctx.SetBody(*s.info.Load())
}

// orderRequest is what every request about one order checks first: the per-IP
// limit, the token, the sale and the order id. When it answers false, it has
// answered the request.
func (g *Gateway) orderRequest(ctx *fasthttp.RequestCtx, s *sale, rawID []byte) (*auth.Claims, uint64, time.Time, bool) {
	now := g.now()
	if !g.allowIP(ctx, now) {
		return nil, 0, now, false
	}
	claims, ok := g.user(ctx, now)
	if !ok {
		return nil, 0, now, false
	}
	if s == nil {
		fail(ctx, fasthttp.StatusNotFound, flashgate.CodeSaleNotFound, "no such sale")
		return nil, 0, now, false
	}
	id, ok := parseOrderID(rawID)
	if !ok {
		fail(ctx, fasthttp.StatusNotFound, flashgate.CodeOrderNotFound, "no such order")
		return nil, 0, now, false
	}
	return claims, id, now, true
}

// getOrder is GET /v1/sales/{sale}/orders/{order}: owner only; anyone else,
// like a missing order, gets 404. Reads are limited per buyer
// (ratelimit.per_user_view); an id that cannot be the buyer's is answered
// here (orderids.go); only an id the buyer's records cannot decide is read
// from MySQL.
func (g *Gateway) getOrder(ctx *fasthttp.RequestCtx, s *sale, rawID []byte) {
	claims, id, now, ok := g.orderRequest(ctx, s, rawID)
	if !ok {
		return
	}
	if ok, wait := g.limits.OrderView.Allow(ratelimit.KeyString(claims.Subject), now.UnixNano()); !ok {
		g.limited(ctx, metrics.LimitView, "too many order reads from your account", wait)
		return
	}
	if !possibleID(s, id, now) {
		noSuchOrder(ctx)
		return
	}
	rctx, cancel := context.WithTimeout(context.Background(), g.cfg.Gateway.AdmitTimeout)
	rec, known, rebuilt, err := lua.OrderSince(rctx, g.rc, s.keys.Home(claims.Subject), id)
	cancel()
	if err != nil {
		unavailable(ctx, "order state unavailable")
		return
	}
	switch mine, gone := ownRecord(&rec, known, claims.Subject, id, rebuilt); {
	case gone:
		noSuchOrder(ctx)
		return
	case mine:
		b, err := encodeOrderView(&rec)
		if err != nil {
			fail(ctx, fasthttp.StatusInternalServerError, flashgate.CodeInternal, "encode order")
			return
		}
		ctx.SetContentTypeBytes(ctJSON)
		ctx.SetBody(b)
		return
	}
	if !g.saleWarm(s) {
		// Redis lost the sale: its orders come back with the warm (from
		// MySQL), so "no such order" would be a guess.
		g.askWarm(s)
		unavailable(ctx, "sale is warming up")
		return
	}
	// Redis cannot tell (an id older than the last rebuild, a lane's order,
	// a record lost on its own): MySQL decides, for someone else's order as
	// for a missing one.
	g.orderFromBackend(ctx, s, claims.Subject, id)
}

// noSuchOrder is the one 404 of an order: missing, someone else's, or an id
// that cannot be one look the same.
func noSuchOrder(ctx *fasthttp.RequestCtx) {
	fail(ctx, fasthttp.StatusNotFound, flashgate.CodeOrderNotFound, "no such order")
}

// orderFromBackend answers GET of an order Redis has no record of with what
// MySQL holds, asking a backend (bus.CmdGet); owner only.
func (g *Gateway) orderFromBackend(ctx *fasthttp.RequestCtx, s *sale, user string, id uint64) {
	cctx, cancel := context.WithTimeout(context.Background(), g.cfg.Gateway.PublishTimeout)
	reply, err := bus.Command(cctx, g.nc, g.cfg.NATS, bus.OrderCommand{Op: bus.CmdGet, SaleID: s.spec.ID, OrderID: id, UserID: user})
	cancel()
	switch {
	case err != nil:
		slog.Warn("order from MySQL", "sale", s.spec.ID, "order", id, "err", err)
		unavailable(ctx, "order state unavailable")
		return
	case flashgate.Code(reply.Code) == flashgate.CodeUnavailable:
		unavailableFor(ctx, nonEmpty(reply.Message, "order state unavailable"), time.Duration(reply.RetryAfterMS)*time.Millisecond)
		return
	case reply.Code != bus.ReplyOK:
		fail(ctx, fasthttp.StatusNotFound, flashgate.CodeOrderNotFound, "no such order")
		return
	}
	o := reply.Order(s.spec.ID, id, user)
	b, err := encodeOrderView(&o)
	if err != nil {
		fail(ctx, fasthttp.StatusInternalServerError, flashgate.CodeInternal, "encode order")
		return
	}
	ctx.SetContentTypeBytes(ctJSON)
	ctx.SetBody(b)
}

// saleWarm reports whether Redis holds the sale's meta (a failed read counts
// as not warm: the caller then answers 503, never a guess).
func (g *Gateway) saleWarm(s *sale) bool {
	rctx, cancel := context.WithTimeout(context.Background(), g.cfg.Gateway.AdmitTimeout)
	defer cancel()
	n, err := g.rc.Do(rctx, g.rc.B().Exists().Key(s.keys.Meta).Build()).AsInt64()
	return err == nil && n == 1
}

// orderCommand is POST …/orders/{order}/cancel: owner only. MySQL is
// where an order changes, so a backend carries it out (bus.Command); the
// gateway refuses what it can answer itself: a bad token, an id that cannot
// be the buyer's order (orderids.go).
func (g *Gateway) orderCommand(ctx *fasthttp.RequestCtx, s *sale, rawID []byte, op string) {
	claims, id, now, ok := g.orderRequest(ctx, s, rawID)
	if !ok {
		return
	}
	if ok, wait := g.allowUser(claims.Subject, now); !ok {
		g.limited(ctx, metrics.LimitUser, "too many requests from your account", wait)
		return
	}
	if !possibleID(s, id, now) {
		noSuchOrder(ctx)
		return
	}
	rctx, cancel := context.WithTimeout(context.Background(), g.cfg.Gateway.AdmitTimeout)
	rec, known, rebuilt, err := lua.OrderSince(rctx, g.rc, s.keys.Home(claims.Subject), id)
	cancel()
	// What the buyer's records decide is answered here: someone else's
	// order and one that never existed alike. The rest goes on (Redis
	// failed, or cannot tell): MySQL decides.
	if _, gone := ownRecord(&rec, known, claims.Subject, id, rebuilt); err == nil && gone {
		noSuchOrder(ctx)
		return
	}
	cctx, cancel := context.WithTimeout(context.Background(), g.cfg.Gateway.PublishTimeout)
	reply, err := bus.Command(cctx, g.nc, g.cfg.NATS, bus.OrderCommand{Op: op, SaleID: s.spec.ID, OrderID: id, UserID: claims.Subject})
	cancel()
	if err != nil {
		slog.Warn("order command", "op", op, "sale", s.spec.ID, "order", id, "err", err)
		unavailable(ctx, "order service unavailable")
		return
	}
	switch flashgate.Code(reply.Code) {
	case bus.ReplyOK:
		o := reply.Order(s.spec.ID, id, claims.Subject)
		b, err := encodeOrderView(&o)
		if err != nil {
			fail(ctx, fasthttp.StatusInternalServerError, flashgate.CodeInternal, "encode order")
			return
		}
		ctx.SetContentTypeBytes(ctJSON)
		ctx.SetBody(b)
	case flashgate.CodeOrderNotFound:
		fail(ctx, fasthttp.StatusNotFound, flashgate.CodeOrderNotFound, "no such order")
	case flashgate.CodeOrderClosed:
		fail(ctx, fasthttp.StatusConflict, flashgate.CodeOrderClosed, nonEmpty(reply.Message, "the order is closed"))
	case flashgate.CodeConflict:
		failRetry(ctx, fasthttp.StatusConflict, flashgate.CodeConflict, nonEmpty(reply.Message, "the order is still being confirmed"), 1)
	case flashgate.CodeInvalidRequest:
		fail(ctx, fasthttp.StatusBadRequest, flashgate.CodeInvalidRequest, nonEmpty(reply.Message, "invalid order command"))
	default:
		unavailableFor(ctx, nonEmpty(reply.Message, "order service unavailable"), time.Duration(reply.RetryAfterMS)*time.Millisecond)
	}
}

func nonEmpty(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
