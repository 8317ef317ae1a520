package backend

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics"
)

const (
	// pullExpiry is how long one pull request of the consumer's long-lived
	// pull lives on the server before the client renews it.
	pullExpiry = 10 * time.Second
	// releaseWait bounds the wait for the messages still on their way when a
	// pull is released.
	releaseWait = 2 * time.Second
	// nakBase is the first redelivery delay of a poison suspect; it doubles per delivery.
	nakBase = 250 * time.Millisecond
	// nakMax caps it.
	nakMax = 10 * time.Second
	// loopPauseMax caps the loop's pause after consecutive failed batches.
	loopPauseMax = 5 * time.Second
	// lagPoll is how often the consumer's lag is read for the metrics.
	lagPoll = 2 * time.Second
)

// consumerConfig is the durable pull consumer every backend shares. The
// server never gives up on a message (MaxDeliver unlimited) and has no
// back-off of its own: the backend alone decides when a message is poison
// (backend.max_deliver, retryLater) and how long a failed one waits
// (nakDelay), and an outage spends no delivery at all (outage.go). A server
// limit would leave a message that ran out of deliveries in the work-queue
// stream for good, and a server back-off stacks on the nak's delay (nats-server
// counts a nak's delay from the delivery's ack wait: with BackOff the
// deliveries came at 0, 0.3 s, 31 s, 122 s …).
func consumerConfig(cfg config.BackendOptions) jetstream.ConsumerConfig {
	ackWait := cfg.Backend.AckWait
	if ackWait <= 0 {
		ackWait = config.Default().Backend.AckWait
	}
	return jetstream.ConsumerConfig{
		Durable:       cfg.NATS.Consumer,
		Description:   "flashgate backends: admitted orders to MySQL",
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		FilterSubject: cfg.NATS.OrderSubject + ".>",
		MaxAckPending: cfg.Backend.MaxAckPending,
		MaxDeliver:    -1,
		AckWait:       ackWait,
	}
}

// ingest turns admitted orders from JetStream into MySQL rows: the consumer
// loop, the batch writer and the dead letters. It holds the clients, the
// consumer and the metrics that path uses, and the two config sections it reads.
type ingest struct {
	cfg     ingestConfig
	log     *slog.Logger
	db      *sql.DB
	rc      rueidis.Client
	nc      *nats.Conn
	js      jetstream.JetStream
	cons    jetstream.Consumer
	scripts *lua.Scripts
	writer  *orderWriter
	metrics *metrics.Backend
	ops     *opsMetrics
	caps    stallCaps // sales whose writes stalled lately
	room    *waitRoom // sales whose orders wait for a dependency (outage.go)
	// procCtx carries the batch in hand's work: cancelled only when Shutdown
	// runs out of time.
	procCtx context.Context
}

// ingestConfig is what ingest reads of the configuration.
type ingestConfig struct {
	NATS    config.NATS
	Backend config.Backend
}

// consume is the consumer loop: take a batch, write it, repeat, until ctx ends.
// It rides out NATS, MySQL and Redis outages: a failed batch is nak'ed with a
// delay and the loop pauses before the next.
//
// The orders come through one long-lived pull (jetstream.Consumer.Messages):
// a subscription that stays open while the backend runs, which the client
// keeps asking the server to fill up to batch_size messages ahead. A message
// the server sends arrives in it whenever it comes. (The loop used to make two
// short pulls per batch, each on an inbox of its own that it stopped reading
// when the pull timed out: a message the server sent as that happened reached
// nobody and waited out ack_wait before its redelivery, which left the last
// orders of a flood unwritten for 30 s.)
func (ig *ingest) consume(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	var it jetstream.MessagesContext
	defer func() {
		// The orders waiting for a dependency go back to the server for
		// another backend, and so do those fetched and not taken.
		ig.room.close()
		if it != nil {
			ig.release(it)
		}
	}()
	failures := 0
	for ctx.Err() == nil {
		if it == nil {
			var err error
			if it, err = ig.pull(); err != nil {
				ig.log.Warn("pulling orders", "err", err)
				failures++
				_ = sleep(ctx, pause(failures))
				continue
			}
		}
		msgs, err := ig.batch(ctx, it)
		if err != nil {
			// The pull ended (consumer deleted, connection closed): a new one
			// is opened after the batch in hand.
			ig.log.Warn("fetching orders", "err", err)
			ig.release(it)
			it = nil
		}
		if len(msgs) == 0 {
			if err != nil {
				failures++
				_ = sleep(ctx, pause(failures))
			}
			continue
		}
		if ig.handle(msgs) {
			failures = 0
			continue
		}
		failures++
		_ = sleep(ctx, pause(failures))
	}
}

func pause(failures int) time.Duration {
	return min(loopPauseMax, 100*time.Millisecond<<min(failures, 10))
}

// pull opens the long-lived pull the loop takes its batches from: up to
// batch_size messages asked for ahead of the batch in hand (so the next batch
// is there when this one is written), each pull request living pullExpiry
// with the server's heartbeats on it.
func (ig *ingest) pull() (jetstream.MessagesContext, error) {
	return ig.cons.Messages(jetstream.PullMaxMessages(max(ig.cfg.Backend.BatchSize, 1)),
		jetstream.PullExpiry(pullExpiry), jetstream.WithMessagesErrOnMissingHeartbeat(false))
}

// batch takes one batch off the pull: it waits for a first message (until ctx
// ends), then up to cfg.Backend.BatchWait for more, up to BatchSize. An error
// means the pull has ended; the messages taken before it are returned with it.
func (ig *ingest) batch(ctx context.Context, it jetstream.MessagesContext) ([]jetstream.Msg, error) {
	first, err := it.Next(jetstream.NextContext(ctx))
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil
		}
		return nil, err
	}
	msgs := []jetstream.Msg{first}
	size := ig.cfg.Backend.BatchSize
	if size <= 1 {
		return msgs, nil
	}
	// The window is not cut short by ctx: what it takes is written before the
	// loop stops.
	wctx, cancel := context.WithTimeout(context.Background(), max(ig.cfg.Backend.BatchWait, time.Millisecond))
	defer cancel()
	for len(msgs) < size {
		m, err := it.Next(jetstream.NextContext(wctx))
		if err != nil {
			if wctx.Err() != nil {
				return msgs, nil
			}
			return msgs, err
		}
		msgs = append(msgs, m)
	}
	return msgs, nil
}

// release ends a pull: the server is asked for nothing more, and the messages
// it had already sent this backend but the loop did not take are nak'ed, so
// that another backend gets them now instead of after ack_wait.
func (ig *ingest) release(it jetstream.MessagesContext) {
	it.Drain()
	for {
		m, err := it.Next(jetstream.NextMaxWait(releaseWait))
		if err != nil {
			return
		}
		if err := m.Nak(); err != nil {
			ig.log.Debug("nak on release", "err", err)
		}
	}
}

// entry is one message of a batch with its decoded order.
type entry struct {
	msg   jetstream.Msg
	order flashgate.Order
}

// handle writes one fetched batch, each sale's orders as one transaction (sales
// in parallel: their rows do not meet), and acks, naks or holds every message
// (the orders of a sale that waits for a dependency join it untried). It
// reports whether every group succeeded or waits.
func (ig *ingest) handle(msgs []jetstream.Msg) bool {
	groups := map[string][]entry{}
	for _, m := range msgs {
		if md, err := m.Metadata(); err == nil && md.NumDelivered > 1 {
			ig.metrics.Redelivered()
		}
		o, err := bus.DecodeOrder(m.Data())
		if err != nil {
			// It can never be parsed: it must not block the consumer.
			ig.unparseable(m, err)
			continue
		}
		groups[o.SaleID] = append(groups[o.SaleID], entry{msg: m, order: o})
	}
	var wg sync.WaitGroup
	var failed atomic.Bool
	for sale, es := range groups {
		if ig.room.join(sale, es) {
			continue // the sale waits for a dependency: so do these
		}
		wg.Go(func() {
			if !ig.writeSale(sale, es) {
				failed.Store(true)
			}
		})
	}
	wg.Wait()
	return !failed.Load()
}

// ackWait bounds the processing of one batch (then the server redelivers it).
func (ig *ingest) ackWait() time.Duration {
	if ig.cfg.Backend.AckWait <= 0 {
		return config.Default().Backend.AckWait
	}
	return ig.cfg.Backend.AckWait
}

// errSaleStalled is the cause given to orders that were not tried because an
// earlier part of their batch found the sale's writes stalled.
var errSaleStalled = errors.New("the sale's writes are stalled: not tried")

// writeSale writes one sale's group in parts of at most the sale's stall cap.
// While MySQL cannot write the sale, one part is tried and the rest wait
// untried, and the cap halves each time, so that a batch too slow for its
// deadline is written in smaller transactions (a lock held elsewhere only
// costs one small try per fetch); once the sale writes again the cap doubles
// per successful group until it is gone.
func (ig *ingest) writeSale(sale string, es []entry) bool {
	size := len(es)
	if c := ig.caps.get(sale); c > 0 {
		size = min(size, c)
	}
	ok := true
	for i := 0; i < len(es); i += size {
		part := es[i:min(i+size, len(es))]
		done, stalled := ig.handleSale(sale, part)
		if done {
			continue
		}
		ok = false
		if stalled {
			ig.caps.stalled(sale, len(part))
			ig.room.hold(sale, es[i+len(part):], errSaleStalled)
			return false
		}
	}
	if ok {
		ig.caps.wrote(sale, ig.cfg.Backend.BatchSize)
	}
	return ok
}

// stallCaps are the sales whose writes stalled lately, each with the most
// orders one of its transactions may take for now (see writeSale).
type stallCaps struct {
	mu sync.Mutex
	m  map[string]int
}

// get is sale's cap, 0 for none.
func (c *stallCaps) get(sale string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[sale]
}

// stalled halves the cap below a part of n orders that stalled.
func (c *stallCaps) stalled(sale string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int{}
	}
	c.m[sale] = max(1, n/2)
}

// wrote doubles the cap after a group was written; a cap of a whole batch is
// no cap.
func (c *stallCaps) wrote(sale string, batch int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.m[sale]
	if !ok {
		return
	}
	if n *= 2; n >= max(batch, 1) {
		delete(c.m, sale)
		return
	}
	c.m[sale] = n
}

// handleSale processes one sale's group and acks it; on any error nothing of
// the group is acked, so nothing uncommitted (or not written back to Redis) is
// ever acked: an outage holds the group until its dependencies write (no
// delivery spent), anything else naks it as poison suspects. A redelivery of a
// committed order only writes it back again. It reports whether the group was
// written and, if not, whether MySQL stalled.
func (ig *ingest) handleSale(sale string, es []entry) (done, stalledErr bool) {
	timeout := ig.ackWait()
	ctx, cancel := context.WithTimeout(ig.procCtx, timeout)
	defer cancel()
	began := time.Now()
	orders := make([]flashgate.Order, len(es))
	stored := make([]time.Time, len(es))
	for i, e := range es {
		orders[i] = e.order
		// JetStream's own time of the message: the writer checks the
		// order's created time against it (distrust.go).
		if md, err := e.msg.Metadata(); err == nil {
			stored[i] = md.Timestamp
		}
	}
	outs, err := ig.writer.processStored(ctx, sale, orders, stored)
	if err != nil {
		ig.metrics.BatchFailed()
		// A write MySQL could not make for now (a lock held elsewhere, a
		// deadline, no connection left, read-only) is an outage of this sale,
		// however fast the probe answers: the order waits, it is not poison;
		// so is a Redis that refuses the write (MISCONF, OOM, NOPERM, …), and
		// any failure while a probe finds a dependency refusing writes.
		stalledErr = stalled(err)
		outage := stalledErr || unavailable(err)
		if !outage {
			if perr := ig.writable(sale); perr != nil {
				ig.log.Warn("a dependency of the sale refuses writes: the failed batch is an outage", "sale", sale,
					"err", err, "probe", perr)
				outage = true
			}
		}
		if outage {
			ig.log.Warn("order batch failed in an outage: it waits", "sale", sale, "orders", len(es), "err", err)
			ig.room.hold(sale, es, err)
			return false, stalledErr
		}
		if len(es) > 1 {
			// Not an outage: maybe an order is poison. The halves are tried
			// now, and theirs, so the others do not wait for it: a poison order
			// among n costs 2·log2(n) transactions (deadletter.go).
			ig.log.Warn("order batch failed; retrying it in halves", "sale", sale, "orders", len(es), "err", err)
			half := len(es) / 2
			left, ls := ig.handleSale(sale, es[:half])
			right, rs := ig.handleSale(sale, es[half:])
			return left && right, ls || rs
		}
		ig.log.Error("order failed with its dependencies answering; nak'ed for redelivery", "sale", sale,
			"order", es[0].order.ID, "err", err)
		ig.retryLater(es[0], err, timeout)
		return false, false
	}
	var confirmed, failedN, dropped, existed int
	logged := make([]orderLogged, len(es))
	for i, e := range es {
		o := outs[i]
		switch {
		case o.Dropped:
			dropped++
		case o.Existed || o.Copy:
			existed++
		case o.Status == flashgate.OrderFailed:
			failedN++
		default:
			confirmed++
		}
		ig.recordOutcome(o)
		logged[i] = orderLogged{ID: strconv.FormatUint(o.ID, 10), Status: o.Status, Reason: o.Reason,
			Dropped: o.Dropped, Redelivered: o.Existed || o.Copy, RequestID: e.msg.Headers().Get(bus.HeaderRequestID)}
		if err := e.msg.Ack(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			// The row is committed and written back: a redelivery is a no-op.
			ig.log.Warn("ack", "sale", sale, "err", err)
		}
	}
	ig.metrics.Batch(len(es), time.Since(began))
	// One line per batch names every order with the id of the HTTP request it
	// came from (nginx's $request_id through the gateway, bus.HeaderRequestID):
	// an operator follows a buyer's request to its order here. Per batch, not
	// per order: one write however many orders the batch holds.
	ig.log.Info("orders written", "sale", sale, "confirmed", confirmed, "failed", failedN,
		"dropped", dropped, "redelivered", existed, "orders", logged)
	return true, false
}

// orderLogged is one order in the "orders written" log line.
type orderLogged struct {
	ID          string                `json:"order"`
	Status      flashgate.OrderStatus `json:"status,omitempty"`
	Reason      string                `json:"reason,omitempty"`
	Dropped     bool                  `json:"dropped,omitempty"`
	Redelivered bool                  `json:"redelivered,omitempty"`
	RequestID   string                `json:"request_id,omitempty"`
}

// nakDelay grows with the message's deliveries, up to limit and nakMax.
func nakDelay(m jetstream.Msg, limit time.Duration) time.Duration {
	return retryDelay(deliveries(m), min(limit, nakMax))
}

// retryDelay is the delay before try n+1: nakBase, doubling, at most limit.
func retryDelay(n uint64, limit time.Duration) time.Duration {
	return min(limit, nakBase<<min(max(n, 1)-1, 10))
}

// recordOutcome counts one message's outcome: each order decided once (a copy
// of an order earlier in the same batch shares its outcome and counts as
// existing, like an order MySQL already held).
func (ig *ingest) recordOutcome(o outcome) {
	switch {
	case o.Existed || o.Copy:
		ig.metrics.Existing()
	case o.Dropped:
		ig.metrics.Outcome(metrics.StatusDropped, "")
	default:
		ig.metrics.Outcome(o.Status, o.Reason)
		if o.Status == flashgate.OrderFailed && o.Reason == flashgate.ReasonBadCharges {
			ig.metrics.ChargesRefused()
		}
	}
}

// pollLag records the durable consumer's lag every lagPoll until ctx ends.
// Every backend reports the same shared consumer: aggregate with max, not sum.
func (ig *ingest) pollLag(ctx context.Context) {
	t := time.NewTicker(lagPoll)
	defer t.Stop()
	for {
		c, cancel := context.WithTimeout(ctx, lagPoll)
		info, err := ig.cons.Info(c)
		cancel()
		switch {
		case err == nil:
			ig.metrics.Lag(info.NumPending, info.NumAckPending)
		case ctx.Err() == nil:
			// The consumer loop already warns about NATS being away.
			ig.log.Debug("reading consumer lag", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
