package backend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/mysql"
)

// The outbox publisher (docs/events.md). Every status change of an order is
// a row of MySQL's order_events, written in the transaction that made the
// change (mysql.InsertOrders, InsertFailed, MarkPaid, ReturnUnits). The
// leader reads the rows in the order they were written, publishes each to
// the order-events stream with Nats-Msg-Id = its event id, waits for
// JetStream's acks and only then deletes the rows it acked. A crash between
// the ack and the delete publishes those events again: the stream drops a
// copy within its duplicate window, and consumers dedupe on the event id.
//
// Order per order: one pass publishes at most one event of an order (the
// oldest it has in the outbox); its later events wait for the next pass,
// which starts once this one's acks are in. So an order's events are stored
// in the stream in seq order, whichever publishes fail or time out.

const (
	// eventAckTimeout bounds the wait for a pass's acks: a publish not acked
	// by then is published again by a later pass.
	eventAckTimeout = 5 * time.Second
	// eventBackoffMin and eventBackoffMax bound the back-off after a failed
	// pass (doubling).
	eventBackoffMin = 100 * time.Millisecond
	eventBackoffMax = 5 * time.Second
	// eventGaugeEvery: how often the leader counts the outbox for the
	// backlog gauges.
	eventGaugeEvery = time.Second
)

// eventMetrics is the publisher's part of the backend's metrics.
type eventMetrics struct {
	backlog   prometheus.Gauge
	oldest    prometheus.Gauge
	published prometheus.Counter
	failures  prometheus.Counter
}

func newEventMetrics(reg prometheus.Registerer) *eventMetrics {
	const ns, sub = "flashgate", "backend"
	m := &eventMetrics{
		backlog: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "order_events_backlog",
			Help: "Order events in MySQL's outbox not yet published (set by the leader, which publishes them; 0 elsewhere)."}),
		oldest: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "order_events_oldest_seconds",
			Help: "Age of the oldest order event in the outbox, on MySQL's clock (set by the leader; 0 when none waits)."}),
		published: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "order_events_published_total",
			Help: "Order events published to the order-events stream and acked (a republish after a crash counts again)."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "order_events_publish_failures_total",
			Help: "Publisher passes that failed (MySQL or NATS): the events wait in the outbox, the publisher backs off."}),
	}
	reg.MustRegister(m.backlog, m.oldest, m.published, m.failures)
	return m
}

// eventPublisher moves the outbox to the order-events stream. Only the
// leader runs it (two at once would only publish duplicates the stream
// drops, never out of order: a pass that lost the lead stops at its next
// step).
type eventPublisher struct {
	db      *sql.DB
	js      jetstream.JetStream
	cfg     config.Events
	log     *slog.Logger
	metrics *eventMetrics
	// acked, when set (tests), runs after a pass's acks came in and before
	// its rows are deleted; an error ends the pass there, as a crash would.
	acked func(n int) error
}

// run publishes until ctx ends: a full batch is followed at once by the
// next, an empty or partial one after cfg.Poll, a failed pass after a
// doubling back-off.
func (p *eventPublisher) run(ctx context.Context) {
	defer p.metrics.backlog.Set(0)
	defer p.metrics.oldest.Set(0)
	var backoff time.Duration
	var counted time.Time
	for ctx.Err() == nil {
		n, err := p.pass(ctx)
		if time.Since(counted) >= eventGaugeEvery {
			counted = time.Now()
			p.gauge(ctx)
		}
		wait := p.cfg.Poll
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			p.metrics.failures.Inc()
			backoff = min(max(2*backoff, eventBackoffMin), eventBackoffMax)
			wait = backoff
			p.log.Warn("order events: publish pass failed; the events wait in the outbox", "retry_in", wait, "err", err)
		case n == p.cfg.BatchSize:
			backoff = 0
			continue
		default:
			backoff = 0
		}
		if sleep(ctx, wait) != nil {
			return
		}
	}
}

// gauge sets the backlog gauges from the outbox.
func (p *eventPublisher) gauge(ctx context.Context) {
	n, oldest, err := mysql.EventBacklog(ctx, p.db)
	if err != nil {
		return // MySQL away: the gauges keep the last word; the failures counter tells
	}
	p.metrics.backlog.Set(float64(n))
	p.metrics.oldest.Set(oldest.Seconds())
}

// pass publishes one batch of the outbox and deletes what JetStream acked.
// It answers how many rows it read.
func (p *eventPublisher) pass(ctx context.Context) (int, error) {
	evs, err := mysql.PendingEvents(ctx, p.db, p.cfg.BatchSize)
	if err != nil || len(evs) == 0 {
		return 0, err
	}
	type sent struct {
		pos uint64
		ack jetstream.PubAckFuture
	}
	var inFlight []sent
	var errs []error
	orders := make(map[uint64]bool, len(evs))
	for i := range evs {
		e := &evs[i]
		if orders[e.OrderID] {
			continue // an earlier event of the order goes first, in this pass
		}
		orders[e.OrderID] = true
		m, err := bus.OrderEventMsg(p.cfg, &e.OrderEvent)
		if err != nil {
			return len(evs), fmt.Errorf("order event %s: %w", e.ID, err)
		}
		f, err := p.js.PublishMsgAsync(m)
		if err != nil {
			errs = append(errs, fmt.Errorf("publish order event %s: %w", e.ID, err))
			break
		}
		inFlight = append(inFlight, sent{pos: e.Pos, ack: f})
	}
	acked := make([]uint64, 0, len(inFlight))
	timeout := time.NewTimer(eventAckTimeout)
	defer timeout.Stop()
wait:
	for _, s := range inFlight {
		select {
		case <-s.ack.Ok():
			acked = append(acked, s.pos)
		case err := <-s.ack.Err():
			errs = append(errs, fmt.Errorf("order event %s: %w", s.ack.Msg().Header.Get(jetstream.MsgIDHeader), err))
		case <-timeout.C:
			errs = append(errs, fmt.Errorf("order events: %d acks not in within %v", len(inFlight)-len(acked), eventAckTimeout))
			break wait
		case <-ctx.Done():
			errs = append(errs, ctx.Err())
			break wait
		}
	}
	p.metrics.published.Add(float64(len(acked)))
	if p.acked != nil {
		if err := p.acked(len(acked)); err != nil {
			return len(evs), err
		}
	}
	if len(acked) > 0 {
		// Without the work's context: the events are in the stream, and a
		// pass cut short here publishes them again (harmless, but avoidable).
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), eventAckTimeout)
		defer cancel()
		if err := mysql.DeleteEvents(dctx, p.db, acked); err != nil {
			errs = append(errs, err)
		}
	}
	return len(evs), errors.Join(errs...)
}
