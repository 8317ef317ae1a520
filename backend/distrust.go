package backend

import (
	"strconv"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/orderid"
)

// The backend trusts no message (docs/ingest.md). Whoever holds a gateway's
// NATS credential can publish to the orders stream, so a message is checked
// against what an admission by Redis can have made before MySQL's guards
// count it: the sale's window and per_order_max, its created time against its
// id's time and JetStream's own time of the message, and, for an order Redis
// has no trace of, the sale's last rebuild. Its pay-by time is the backend's
// own (orders.payment_timeout from its created time), never the message's.

// inflow is what the stream says of a batch's messages beyond their bodies.
type inflow struct {
	// stored is JetStream's time of each message (its server's clock); an
	// order missing here (a test driving the writer) counts as stored now.
	stored map[uint64]time.Time
	// unknown are the orders Redis has no trace of (claim.lua's 'unknown').
	unknown map[uint64]bool
	// epoch is the epoch of the sale's books the claims were read in ("":
	// unchecked, books warmed before epochs); split is set when the tags
	// answered different epochs (a master failed over to a replica from
	// before the last rebuild).
	epoch string
	split bool
}

// stale reports whether the claims were read in another epoch than mysql's,
// the sale's epoch now (read under the sale row lock): their answers may
// not be what the rebuild since installed, so nothing may be decided on them.
func (in *inflow) stale(mysql int64) bool {
	if in == nil || (in.epoch == "" && !in.split) {
		return false
	}
	return in.split || in.epoch != strconv.FormatInt(mysql, 10)
}

// storedAt is when the stream stored order id's message.
func (in *inflow) storedAt(id uint64, now time.Time) time.Time {
	if in != nil {
		if t, ok := in.stored[id]; ok && !t.IsZero() {
			return t
		}
	}
	return now
}

// isUnknown reports whether Redis has no trace of order id.
func (in *inflow) isUnknown(id uint64) bool { return in != nil && in.unknown[id] }

// anyUnknown reports whether some order of orders is unknown to Redis.
func (in *inflow) anyUnknown(orders []flashgate.Order) bool {
	if in == nil || len(in.unknown) == 0 {
		return false
	}
	for _, o := range orders {
		if in.unknown[o.ID] {
			return true
		}
	}
	return false
}

// trust are the bounds the writer checks a message's order against.
type trust struct {
	// skew is backend.clock_skew: how far apart the clocks of Redis (an
	// order's created time), a gateway (its id's time) and NATS (the
	// message's stored time) may be.
	skew time.Duration
	// publish is gateway.publish_timeout: how long after its admission an
	// order's message may land in the stream.
	publish time.Duration
	// payBy is orders.payment_timeout.
	payBy time.Duration
}

// with is tr with the bounds given, each that is set.
func (tr trust) with(skew, publish, payBy time.Duration) trust {
	if skew > 0 {
		tr.skew = skew
	}
	if publish > 0 {
		tr.publish = publish
	}
	if payBy > 0 {
		tr.payBy = payBy
	}
	return tr
}

// doubt says why no admission can have made o ("" when one can), and which
// check said so (for the log). rebuiltAt is when the sale's books in Redis
// were last rebuilt (MySQL's clock, read under the sale row lock), used for an
// order Redis does not know; the zero time when the caller has not read it
// (the fast path, which leaves every unknown order to the fallback).
func (tr trust) doubt(shape *saleShape, o flashgate.Order, in *inflow, now, rebuiltAt time.Time) (reason, check string) {
	sale := shape.spec
	switch {
	case !shape.fits(o.Region):
		return reasonUnknownRegion, "region"
	case o.Quantity < 1 || o.Quantity > sale.PerOrderMax:
		return flashgate.ReasonUnadmitted, "quantity"
	case o.CreatedAt.Before(sale.StartsAt.Add(-closeGrace)) || o.CreatedAt.After(sale.EndsAt.Add(closeGrace)):
		// Redis judged the window by the same clock that stamped created;
		// the grace is closeGrace's (a split sale's masters' clocks).
		return flashgate.ReasonUnadmitted, "window"
	}
	if d := o.CreatedAt.Sub(orderid.Time(o.ID)); d > tr.skew || d < -tr.skew {
		// The gateway makes the id just before the admission stamps created.
		return flashgate.ReasonUnadmitted, "id time"
	}
	stored := in.storedAt(o.ID, now)
	if o.CreatedAt.After(stored.Add(tr.skew)) {
		// Published before it was admitted.
		return flashgate.ReasonUnadmitted, "created after its message"
	}
	if !in.isUnknown(o.ID) {
		return "", ""
	}
	// Redis has no trace of it. A Redis that lost its data is rebuilt from
	// MySQL and the stream, and an admission it ran before the loss whose
	// message landed after the rebuild read the stream is the one honest
	// order of this kind: admitted before the rebuild, published within
	// publish_timeout of its admission. Everything else was never admitted.
	switch {
	case stored.Sub(o.CreatedAt) > tr.skew+tr.publish:
		return flashgate.ReasonUnadmitted, "unknown, published late"
	case rebuiltAt.IsZero() || !orderid.Time(o.ID).Before(rebuiltAt):
		return flashgate.ReasonUnadmitted, "unknown, newer than the rebuild"
	}
	return "", ""
}
