package backend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/clip"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
)

// Dead letters (docs/design.md §7). The consumer decides on the message's
// last delivery, in the loop that failed it, rather than listening to the
// server's MAX_DELIVERIES advisory: the advisory is core NATS (at most once,
// lost when no backend listens at that moment), and a work-queue message that
// ran out of deliveries stays in the stream, never delivered again. So the
// server never runs a message out of deliveries (consumerConfig: MaxDeliver
// unlimited): the backend counts them (backend.max_deliver) and, on the last,
// dead-letters the message while it is in hand; if that fails, the message is
// nak'ed and comes back to try again. Every step below is idempotent.
//
// Not every failure is the message's fault. When MySQL, a Redis of the sale
// or NATS cannot write now (outage.go), that is an outage and the order waits
// in the waiting room without spending deliveries. Only an order that fails
// on its own while its dependencies answer writes is poison. A batch that
// fails is retried at once in halves, and those in halves, so one poison order
// holds back nobody else's.

// ReasonDeadLetter is the reason of an order whose message was dead-lettered.
const ReasonDeadLetter = flashgate.ReasonDeadLetter

const (
	// unlimitedLastTry is the delivery a poison message is dead-lettered on when
	// backend.max_deliver is unlimited (≤ 0).
	unlimitedLastTry = 10
	// deadLetterTimeout bounds dead-lettering one message.
	deadLetterTimeout = 10 * time.Second
	// probeTimeout bounds the dependency probe after a failed batch.
	probeTimeout = 2 * time.Second
)

// lastTry is the delivery on which a failing message is given up:
// backend.max_deliver (the server itself never gives up on a message, so a
// backend dying while dead-lettering it leaves the next delivery to finish
// the job).
func lastTry(maxDeliver int) uint64 {
	if maxDeliver <= 0 {
		return unlimitedLastTry
	}
	return uint64(maxDeliver)
}

// deliveries is how often the server has delivered m (1 if unknown).
func deliveries(m jetstream.Msg) uint64 {
	if md, err := m.Metadata(); err == nil && md.NumDelivered > 0 {
		return md.NumDelivered
	}
	return 1
}

func streamSeq(m jetstream.Msg) uint64 {
	if md, err := m.Metadata(); err == nil {
		return md.Sequence.Stream
	}
	return 0
}

// stalled reports whether err says MySQL (or the way to it) cannot write now
// rather than that the orders are wrong (mysql.Stalled). Such a batch is an
// outage of its sale (docs/ingest.md): retried, never dead-lettered.
func stalled(err error) bool { return mysql.Stalled(err) }

// retryLater handles a message whose processing failed with cause while its
// dependencies answered writes (a poison suspect): nak'ed with a delay before
// its last try; on it, dead-lettered. If dead-lettering fails, it is nak'ed
// and dead-lettered on its next delivery.
func (ig *ingest) retryLater(e entry, cause error, limit time.Duration) {
	n := deliveries(e.msg)
	sale, id := e.order.SaleID, e.order.ID
	if n < lastTry(ig.cfg.Backend.MaxDeliver) {
		if err := e.msg.NakWithDelay(nakDelay(e.msg, limit)); err != nil {
			ig.log.Warn("nak", "sale", sale, "order", id, "err", err)
		}
		return
	}
	ctx, cancel := context.WithTimeout(ig.procCtx, deadLetterTimeout)
	defer cancel()
	err := ig.deadLetter(ctx, e, cause)
	if err == nil {
		ig.ops.deadLetters.WithLabelValues(bus.DeadPoison).Inc()
		ig.log.Error("poison order dead-lettered: it ends failed and its units went back", "sale", sale, "order", id,
			"deliveries", n, "reason", ReasonDeadLetter, "err", cause)
		return
	}
	ig.log.Error("dead-lettering an order failed; nak'ed", "sale", sale, "order", id, "deliveries", n,
		"err", err, "cause", cause)
	if err := e.msg.NakWithDelay(nakDelay(e.msg, limit)); err != nil {
		ig.log.Warn("nak", "sale", sale, "order", id, "err", err)
	}
}

// deadHeader is the header of a dead-lettered copy of m.
func (ig *ingest) deadHeader(m jetstream.Msg, kind string, cause error) nats.Header {
	h := nats.Header{}
	h.Set(bus.HdrDeadKind, kind)
	if cause != nil {
		// The cause may quote the message (bus.DecodeOrder does): at most
		// clip.Max bytes of it, no CR or LF that would end the header.
		h.Set(bus.HdrDeadError, clip.Text(cause.Error()))
	}
	h.Set(bus.HdrDeadSubject, m.Subject())
	h.Set(bus.HdrDeadSequence, strconv.FormatUint(streamSeq(m), 10))
	h.Set(bus.HdrDeadDeliveries, strconv.FormatUint(deliveries(m), 10))
	h.Set(bus.HdrDeadAt, time.Now().UTC().Format(time.RFC3339Nano))
	h.Set(bus.HdrDeadConsumer, ig.cfg.NATS.Consumer)
	return h
}

// deadLetter gives up on a poison order: a copy goes to the dead-letter
// stream, the order ends failed (dead_letter) in MySQL unless MySQL has decided
// it already, its reservation goes back to Redis, and the original is
// terminated. Each step is idempotent, so a rerun after a crash is harmless.
func (ig *ingest) deadLetter(ctx context.Context, e entry, cause error) error {
	o := e.order
	id := strconv.FormatUint(o.ID, 10)
	h := ig.deadHeader(e.msg, bus.DeadPoison, cause)
	h.Set(bus.HdrDeadOrder, id)
	copyMsg := &nats.Msg{Subject: bus.DeadLetterSubject(ig.cfg.NATS, bus.DeadPoison, o.SaleID), Header: h, Data: e.msg.Data()}
	if _, err := ig.js.PublishMsg(ctx, copyMsg, jetstream.WithMsgID("dlq-"+id)); err != nil {
		return fmt.Errorf("dead-letter %s/%d: publish: %w", o.SaleID, o.ID, err)
	}
	// The pay-by time is the backend's, as the writer's (distrust.go): a
	// message's own (year 12000) could keep its failed row out of MySQL.
	o.ExpiresAt = o.CreatedAt.Add(ig.writer.trust.payBy)
	st, inserted, err := failOrderRow(ctx, ig.db, o, ReasonDeadLetter, time.Now().UTC())
	if err != nil {
		return fmt.Errorf("dead-letter %s/%d: %w", o.SaleID, o.ID, err)
	}
	if st.status == flashgate.OrderFailed {
		if err := ig.releaseFailed(ctx, o, st.reason); err != nil {
			return fmt.Errorf("dead-letter %s/%d: %w", o.SaleID, o.ID, err)
		}
		if inserted {
			ig.metrics.Outcome(flashgate.OrderFailed, ReasonDeadLetter)
		}
	} else {
		// MySQL counted the order: only the write-back to Redis failed. Its
		// reservation stays until reconcile writes MySQL's word back.
		ig.log.Warn("dead-lettered order is in MySQL already: left as it is", "sale", o.SaleID, "order", o.ID, "status", st.status)
	}
	if err := e.msg.Term(); err != nil {
		return fmt.Errorf("dead-letter %s/%d: term: %w", o.SaleID, o.ID, err)
	}
	return nil
}

// releaseFailed gives a failed order's units back to Redis, exactly once, with
// the region and charges of its reservation (the message's may be what made
// it poison). A
// Redis that does not know the order is told it failed, so the buyer sees why.
func (ig *ingest) releaseFailed(ctx context.Context, o flashgate.Order, reason string) error {
	region, charges := o.Region, o.Charges
	k, err := epochKeys(ctx, ig.db, o.SaleID)
	if err != nil {
		return err
	}
	home := k.Home(o.UserID)
	rec, ok, err := lua.Order(ctx, ig.rc, home, o.ID)
	if err != nil {
		return err
	}
	if ok {
		region, charges = rec.Region, rec.Charges
	}
	r, err := ig.scripts.Release(ctx, ig.rc, k.HomeFor(o.UserID, region), o.ID, region, charges, lua.ReleaseBackend, reason)
	if err != nil {
		return err
	}
	if r.Released && ig.writer.restocked != nil {
		ig.writer.restocked(o.SaleID, region)
	}
	if r.Unknown {
		failed := o
		failed.Status, failed.Reason = flashgate.OrderFailed, reason
		if _, err := ig.scripts.Confirm(ctx, ig.rc, home, []flashgate.Order{failed}); err != nil && !errors.Is(err, lua.ErrStaleEpoch) {
			return err
		}
	}
	return nil
}

// DATETIME(3) bounds: a poison message may carry any time.
var (
	minRowTime = time.Unix(0, 0).UTC()
	maxRowTime = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
)

func rowTime(ms int64) time.Time {
	t := time.UnixMilli(ms).UTC()
	switch {
	case t.Before(minRowTime):
		return minRowTime
	case t.After(maxRowTime):
		return maxRowTime
	}
	return t
}

// failOrderRow writes o as failed with reason, if MySQL has no row of it, and
// answers the row's status and reason (what MySQL decided, if it had the row)
// and whether it wrote it. Failed orders count nowhere: no counter moves.
func failOrderRow(ctx context.Context, db *sql.DB, o flashgate.Order, reason string, now time.Time) (settlement, bool, error) {
	row := o
	row.Status, row.Reason = flashgate.OrderFailed, reason
	row.CreatedAt, row.ExpiresAt = rowTime(o.CreatedAt.UnixMilli()), rowTime(o.ExpiresAt.UnixMilli())
	inserted, err := mysql.InsertFailed(ctx, db, row, now)
	if err != nil {
		return settlement{}, false, fmt.Errorf("failed row: %w", err)
	}
	st, err := mysql.OrderStateOf(ctx, db, o.SaleID, o.ID)
	if err == nil && st.OtherSale {
		// The id is another sale's order's (made twice): this one can have
		// no row. It fails, and its units go back.
		return settlement{status: flashgate.OrderFailed, reason: flashgate.ReasonIDTaken}, false, nil
	}
	if errors.Is(err, mysql.ErrNoOrder) && o.IdemKey != "" {
		// Another order holds the Idempotency-Key (orders_sale_user_idem): this
		// one's row goes without it.
		o.IdemKey = ""
		return failOrderRow(ctx, db, o, reason, now)
	}
	if err != nil {
		return settlement{}, false, fmt.Errorf("failed row: %w", err)
	}
	return settlement{status: st.Status, reason: st.Reason, existed: !inserted}, inserted, nil
}

// unparseable handles a message that can never be decoded: it must not block
// the consumer. It goes to the dead-letter stream as it is and is terminated;
// if that fails it is retried later, and on its last try terminated anyway
// with its body in the log.
func (ig *ingest) unparseable(m jetstream.Msg, cause error) {
	ctx, cancel := context.WithTimeout(ig.procCtx, deadLetterTimeout)
	defer cancel()
	sale := bus.SaleOfSubject(ig.cfg.NATS, m.Subject())
	seq := streamSeq(m)
	copyMsg := &nats.Msg{Subject: bus.DeadLetterSubject(ig.cfg.NATS, bus.DeadUnparseable, sale),
		Header: ig.deadHeader(m, bus.DeadUnparseable, cause), Data: m.Data()}
	_, err := ig.js.PublishMsg(ctx, copyMsg, jetstream.WithMsgID("dlq-seq-"+strconv.FormatUint(seq, 10)))
	if err == nil {
		ig.ops.deadLetters.WithLabelValues(bus.DeadUnparseable).Inc()
		ig.log.Error("unparseable order message dead-lettered", "subject", m.Subject(), "seq", seq, "err", cause)
		if err := m.Term(); err != nil {
			ig.log.Warn("term", "subject", m.Subject(), "err", err)
		}
		return
	}
	if deliveries(m) < lastTry(ig.cfg.Backend.MaxDeliver) {
		ig.log.Warn("dead-lettering an unparseable message failed; nak'ed", "subject", m.Subject(), "err", err)
		if err := m.NakWithDelay(nakDelay(m, time.Second)); err != nil {
			ig.log.Warn("nak", "subject", m.Subject(), "err", err)
		}
		return
	}
	ig.log.Error("terminating an unparseable order message that could not be dead-lettered: the log keeps its start",
		"subject", m.Subject(), "seq", seq, "body", clip.Quote(m.Data()), "bytes", len(m.Data()), "err", cause, "dlq_err", err)
	if err := m.Term(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		ig.log.Warn("term", "subject", m.Subject(), "err", err)
	}
}
