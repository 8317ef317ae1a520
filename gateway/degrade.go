package gateway

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
	"github.com/valyala/fasthttp"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
)

// The degraded lane's gateway half (docs/degrade.md). A sale with degrade:
// mysql sends its purchases to the lane (a backend decides them in MySQL,
// bus.Purchase) instead of answering 503 while its Redis shard does not
// answer, and keeps them there while the sale is stale (the lane wrote orders
// Redis has not been warmed with), until the leader's EventFresh. At most the
// sale's degrade_rate purchases are on the lane at once from this gateway;
// the next is answered 503 at once.

// laneTimeout is how long a purchase waits for the lane's answer (a
// backend's decision waits as long at most).
const laneTimeout = 3 * time.Second

// laneState is a sale's lane on this gateway.
type laneState struct {
	// stale: the lane wrote orders of the sale that Redis does not count yet.
	stale atomic.Bool
	// busy counts the purchases on the lane now.
	busy atomic.Int64
}

// laneFirst reports whether a purchase of s goes to the lane without asking
// Redis: the sale is stale, or its shard's breaker is open, or the order-id
// lease (kept in Redis) is lost.
func (g *Gateway) laneFirst(s *sale) bool {
	if s.spec.DegradeMode() != flashgate.DegradeMySQL {
		return false
	}
	return s.lane.stale.Load() || g.breakers.forSlot(s.slot).State() == gobreaker.StateOpen || !g.lease.Load().Valid()
}

// viaLane runs the purchase on the lane and answers it; false (nothing
// answered) when the sale has no lane, or the lane found Redis back and the
// sale fresh: the caller then goes on as it would have without the lane.
func (g *Gateway) viaLane(ctx *fasthttp.RequestCtx, s *sale, sub *flashgate.Subjects, qty int64, region, idem string, now time.Time) bool {
	limit := s.spec.DegradeLimit()
	if limit == 0 {
		return false
	}
	if s.lane.busy.Add(1) > limit {
		s.lane.busy.Add(-1)
		unavailable(ctx, "degraded lane busy")
		return true
	}
	defer s.lane.busy.Add(-1)
	o := flashgate.Order{SaleID: s.spec.ID, UserID: sub.User, Quantity: qty, Region: region, IdemKey: idem,
		Phone: sub.Phone, Device: sub.Device, IP: sub.IP, Address: sub.Address,
		CreatedAt: now, ExpiresAt: now.Add(g.cfg.PaymentTimeout)}
	lctx, cancel := context.WithTimeout(context.Background(), laneTimeout)
	defer cancel()
	r, err := bus.Purchase(lctx, g.nc, g.cfg.NATS, bus.PurchaseOf(&o))
	if err != nil {
		slog.Warn("degraded lane: no decision", "sale", s.spec.ID, "err", err)
		unavailable(ctx, "stock service unavailable")
		return true
	}
	return g.answerLane(ctx, s, region, r)
}

// answerLane answers the lane's decision as answerAdmission answers the
// script's: the same statuses, codes and messages.
func (g *Gateway) answerLane(ctx *fasthttp.RequestCtx, s *sale, region string, r bus.LaneReply) bool {
	switch flashgate.LaneOutcome(r.Outcome) {
	case flashgate.LaneFresh:
		s.lane.stale.Store(false)
		return false
	case flashgate.LaneAdmitted:
		s.lane.stale.Store(true)
		if r.Remaining <= 0 {
			g.markSoldOut(s, region)
		}
		// MySQL holds the order, confirmed: the 202 promises no less than
		// the fast path's (JetStream holds it).
		accepted(ctx, r.OrderID, flashgate.OrderConfirmed)
	case flashgate.LaneReplayed:
		accepted(ctx, r.OrderID, flashgate.OrderStatus(r.Status).Public())
	case flashgate.LaneNotStarted:
		failRetry(ctx, statusTooEarly, flashgate.CodeNotStarted, "the sale has not started", ceilSeconds(r.WaitMS))
	case flashgate.LaneEnded:
		fail(ctx, fasthttp.StatusGone, flashgate.CodeEnded, "the sale has ended")
	case flashgate.LanePaused:
		paused(ctx)
	case flashgate.LaneBadQuantity:
		fail(ctx, fasthttp.StatusBadRequest, flashgate.CodeInvalidRequest, "quantity out of range")
	case flashgate.LaneBadOrder:
		fail(ctx, fasthttp.StatusBadRequest, flashgate.CodeInvalidRequest, "the purchase does not fit the sale")
	case flashgate.LaneLimitReached:
		limitReached(ctx, s.limitBody(r.Limit))
	case flashgate.LaneSoldOut:
		g.markSoldOut(s, region)
		fail(ctx, fasthttp.StatusConflict, flashgate.CodeSoldOut, "sold out")
	case flashgate.LaneDuplicateID:
		slog.Error("degraded lane: order id already taken: the id source is broken", "sale", s.spec.ID, "order", r.OrderID)
		unavailable(ctx, "order ids unavailable")
	case flashgate.LaneUnknownSale:
		unavailable(ctx, "sale is warming up")
	default: // unavailable, invalid
		unavailable(ctx, "stock service unavailable")
	}
	return true
}

// onLaneEvent keeps the sale's stale mark: EventStale from the backend whose
// lane wrote an order, EventFresh from the leader that warmed it again.
func (g *Gateway) onLaneEvent(ev bus.SaleEvent) {
	if s := g.sales.get([]byte(ev.SaleID)); s != nil {
		s.lane.stale.Store(ev.Type == bus.EventStale)
	}
}
