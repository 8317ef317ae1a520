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
// like a missing order, gets 404.
func (g *Gateway) getOrder(ctx *fasthttp.RequestCtx, s *sale, rawID []byte) {
	claims, id, _, ok := g.orderRequest(ctx, s, rawID)
	if !ok {
		return
	}
	rctx, cancel := context.WithTimeout(context.Background(), g.cfg.Gateway.AdmitTimeout)
	rec, ok, err := lua.Order(rctx, g.rc, s.keys.Home(claims.Subject), id)
	cancel()
	if err != nil {
		unavailable(ctx, "order state unavailable")
		return
	}
	if !ok && !g.saleWarm(s) {
		// Redis lost the sale: its orders come back with the warm (from
		// MySQL), so "no such order" would be a guess.
		g.askWarm(s)
		unavailable(ctx, "sale is warming up")
		return
	}
	if !ok {
		// Redis lost the order but not the sale (the warm brings orders
		// back; keys can still go missing one by one): MySQL may hold it.
		g.orderFromBackend(ctx, s, claims.Subject, id)
		return
	}
	if rec.UserID != claims.Subject || rec.Status == lua.StatusReleased {
		fail(ctx, fasthttp.StatusNotFound, flashgate.CodeOrderNotFound, "no such order")
		return
	}
	b, err := encodeOrderView(&rec)
	if err != nil {
		fail(ctx, fasthttp.StatusInternalServerError, flashgate.CodeInternal, "encode order")
		return
	}
	ctx.SetContentTypeBytes(ctJSON)
	ctx.SetBody(b)
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
		unavailable(ctx, nonEmpty(reply.Message, "order state unavailable"))
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
// gateway refuses what it can answer itself: a bad token, another user's order.
func (g *Gateway) orderCommand(ctx *fasthttp.RequestCtx, s *sale, rawID []byte, op string) {
	claims, id, now, ok := g.orderRequest(ctx, s, rawID)
	if !ok {
		return
	}
	if ok, wait := g.allowUser(claims.Subject, now); !ok {
		g.limited(ctx, metrics.LimitUser, "too many requests from your account", wait)
		return
	}
	rctx, cancel := context.WithTimeout(context.Background(), g.cfg.Gateway.AdmitTimeout)
	rec, known, err := lua.Order(rctx, g.rc, s.keys.Home(claims.Subject), id)
	cancel()
	// Another user's order, or one that never existed, is answered here. An
	// order Redis does not know (it lost its data) goes on: MySQL decides.
	if err == nil && known && (rec.UserID != claims.Subject || rec.Status == lua.StatusReleased) {
		fail(ctx, fasthttp.StatusNotFound, flashgate.CodeOrderNotFound, "no such order")
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
		unavailable(ctx, nonEmpty(reply.Message, "order service unavailable"))
	}
}

func nonEmpty(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
