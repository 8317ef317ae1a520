package backend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics"
	"github.com/flashgate/flashgate/mysql"
)

// The order life cycle after MySQL confirmed an order (docs/design.md §3, issue 4): the
// buyer pays it, or cancels it, or lets the payment deadline pass and the sweeper
// expires it. MySQL decides. Every transaction takes the sale row lock first,
// as the batch writer does, so they queue there and cannot deadlock; a
// payment moves no unit, but takes it too (and reads the price under it). A
// canceled or expired order gives its units back to sales.sold, its region's
// sold and its buyer's units in the same transaction, and then to Redis (stock
// and the buyer's counter, lua.RestockMany, exactly once per order), and the
// gateways hear bus.EventRestocked so their sold-out marks go.

const (
	// commandTimeout bounds one pay or cancel. The gateway waits
	// gateway.publish_timeout (2 s by default); a command that finishes after it
	// gave up is still right, and the buyer's retry sees it: both are idempotent.
	commandTimeout = 5 * time.Second
	// payWorkers and commandWorkers are how many payments, and how many
	// cancels and reads, one backend carries out at once: two pools, so
	// that a flood of a buyer's commands cannot hold up the payment
	// service's (docs/backend.md, "Order commands").
	payWorkers     = 8
	commandWorkers = 16
	// payQueue and commandQueue bound the commands waiting for a worker of
	// each pool. A command that finds its queue full is answered
	// unavailable at once (the gateway's 503, with a Retry-After of the time
	// to work the queue off): a queue longer than a worker pool can empty
	// within the gateway's wait only turns answers into timeouts.
	payQueue     = 64
	commandQueue = 64
	// commandRetries bounds the attempts of a command's transaction (deadlocks
	// and lock wait timeouts).
	commandRetries = 4
	// drainTimeout bounds how long Shutdown waits for queued commands.
	drainTimeout = 2 * time.Second
	// redisTimeout bounds the Redis step after a commit: it runs even when the
	// command's own time is up, MySQL having changed already.
	redisTimeout = 2 * time.Second

	// sweepLimit is how many expired orders one sweep pass takes.
	sweepLimit = 10000
	// sweepChunk is the orders of one transaction (and one restock call): it
	// bounds how long the sweeper holds a sale's row lock, which the sale's
	// order batches wait for.
	sweepChunk = 500
)

// lifecycle carries out what happens to an order after MySQL confirmed it:
// the gateways' pay and cancel commands, the expiry sweep, and the restock of
// what a cancel or expiry gave back. It holds only the clients it writes to.
type lifecycle struct {
	db      *sql.DB
	rc      rueidis.Client
	nc      *nats.Conn
	nats    config.NATS
	scripts *lua.Scripts
	log     *slog.Logger
	events  *saleEvents
	// procCtx is the backend's: cancelled only when Shutdown runs out of time.
	procCtx context.Context
	// metrics counts the orders expired (nil in tests that build a bare lifecycle).
	metrics *metrics.Backend
}

// commandServer carries out order commands for the gateways: the
// subscription of the backends' queue group, which only sorts each command
// into its pool's queue, and the workers of the two pools.
type commandServer struct {
	subs []*nats.Subscription
	pay  *commandPool
	cmd  *commandPool

	mu       sync.RWMutex
	stopping bool
	wg       sync.WaitGroup
}

// queuedCommand is a command waiting for a worker, with what answers it.
type queuedCommand struct {
	cmd    bus.OrderCommand
	answer func(bus.OrderReply)
}

// commandPool is one pool: its bounded queue, and how long its commands
// took lately (what a full queue's Retry-After is worked out from).
type commandPool struct {
	workers int
	queue   chan queuedCommand
	// avgNS is a moving average of a command's time in a worker.
	avgNS atomic.Int64
}

func newCommandPool(workers, queue int) *commandPool {
	return &commandPool{workers: workers, queue: make(chan queuedCommand, queue)}
}

// took folds one command's time into the average (a weight of 1/8).
func (p *commandPool) took(d time.Duration) {
	old := p.avgNS.Load()
	p.avgNS.Store(old + (int64(d)-old)/8)
}

// backlog is how long the queue as it stands takes to work off: the
// cause's length behind a full queue's Retry-After.
func (p *commandPool) backlog() time.Duration {
	return time.Duration(int64(len(p.queue)+p.workers) * max(p.avgNS.Load(), int64(time.Millisecond)) / int64(p.workers))
}

// full is the answer of a command whose queue is full.
func (p *commandPool) full() bus.OrderReply {
	return bus.OrderReply{Code: string(flashgate.CodeUnavailable), Message: "order service busy; retry",
		RetryAfterMS: max(p.backlog().Milliseconds(), 1)}
}

// take queues a command for its pool, or answers it at once: the backend is
// stopping, or the queue is full. It runs on the subscription's goroutine
// and never blocks.
func (cs *commandServer) take(cmd bus.OrderCommand, answer func(bus.OrderReply)) {
	p := cs.cmd
	if cmd.Op == bus.CmdPay {
		p = cs.pay
	}
	cs.mu.RLock()
	defer cs.mu.RUnlock()
	if cs.stopping {
		answer(bus.OrderReply{Code: string(flashgate.CodeUnavailable), Message: "backend shutting down; retry"})
		return
	}
	select {
	case p.queue <- queuedCommand{cmd: cmd, answer: answer}:
	default:
		answer(p.full())
	}
}

// serveCommands starts the two pools' workers and joins the queue group of
// order commands (bus.ServeCommandsLater).
func (l *lifecycle) serveCommands() (*commandServer, error) {
	cs := &commandServer{pay: newCommandPool(payWorkers, payQueue), cmd: newCommandPool(commandWorkers, commandQueue)}
	for _, p := range []*commandPool{cs.pay, cs.cmd} {
		for range p.workers {
			cs.wg.Go(func() {
				for q := range p.queue {
					start := time.Now()
					q.answer(l.handleCommand(q.cmd))
					p.took(time.Since(start))
				}
			})
		}
	}
	sub, err := bus.ServeCommandsLater(l.nc, l.nats, cs.take)
	if err != nil {
		cs.closeQueues()
		cs.wg.Wait()
		return nil, fmt.Errorf("order commands: %w", err)
	}
	cs.subs = append(cs.subs, sub)
	// Ready means answering: the server must know the subscription before
	// a gateway's first pay, or that pay finds no responder (503).
	if err := l.nc.Flush(); err != nil {
		return cs, fmt.Errorf("order commands: %w", err)
	}
	return cs, nil
}

// closeQueues stops taking commands: the workers finish what is queued and
// end.
func (cs *commandServer) closeQueues() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.stopping {
		return
	}
	cs.stopping = true
	close(cs.pay.queue)
	close(cs.cmd.queue)
}

// stop leaves the queue group and takes the commands already received (NATS
// drain), then lets the workers answer what is queued. The drain gets
// drainTimeout at most (it needs NATS, which may be the thing that is down):
// commands still undelivered then are dropped, and their gateways answer 503
// (a retry is safe).
func (cs *commandServer) stop(ctx context.Context) error {
	if cs == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	var errs []error
	closed := make([]<-chan nats.SubStatus, len(cs.subs))
	for i, s := range cs.subs {
		closed[i] = s.StatusChanged(nats.SubscriptionClosed)
		if err := s.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
			errs = append(errs, fmt.Errorf("drain order commands: %w", err))
		}
	}
	undrained := 0
	for i, ch := range closed {
		select {
		case <-ch:
		case <-ctx.Done():
			_ = cs.subs[i].Unsubscribe()
			undrained++
		}
	}
	if undrained > 0 {
		errs = append(errs, fmt.Errorf("order commands: %d of %d subscriptions not drained: %w", undrained, len(cs.subs), ctx.Err()))
	}
	cs.closeQueues()
	cs.wg.Wait()
	return errors.Join(errs...)
}

// handleCommand carries out one pay or cancel. A failure of MySQL or Redis
// answers unavailable (the gateway's 503): the buyer may retry, both commands
// being idempotent.
func (l *lifecycle) handleCommand(cmd bus.OrderCommand) bus.OrderReply {
	ctx, cancel := context.WithTimeout(l.procCtx, commandTimeout)
	defer cancel()
	var (
		r   bus.OrderReply
		err error
	)
	switch cmd.Op {
	case bus.CmdPay:
		r, err = l.pay(ctx, cmd)
	case bus.CmdCancel:
		r, err = l.cancel(ctx, cmd, time.Now())
	case bus.CmdGet:
		r, err = l.getOrder(ctx, cmd)
	default:
		return bus.OrderReply{Code: string(flashgate.CodeInvalidRequest), Message: "unknown order command"}
	}
	if err != nil {
		l.log.Error("order command failed", "op", cmd.Op, "sale", cmd.SaleID, "order", cmd.OrderID, "err", err)
		return bus.OrderReply{Code: string(flashgate.CodeUnavailable), Message: "order service unavailable; retry"}
	}
	return r
}

// getOrder answers an order MySQL holds, to its owner only, and writes its
// record back to a Redis that lost it (HSETNX: a record there is newer).
func (l *lifecycle) getOrder(ctx context.Context, cmd bus.OrderCommand) (bus.OrderReply, error) {
	o, err := mysql.Order(ctx, l.db, cmd.SaleID, cmd.OrderID)
	if errors.Is(err, mysql.ErrNoOrder) {
		return notFound, nil
	}
	if err != nil {
		return bus.OrderReply{}, fmt.Errorf("order %d: %w", cmd.OrderID, err)
	}
	if o.UserID != cmd.UserID {
		return notFound, nil
	}
	k, err := keysOf(ctx, l.db, cmd.SaleID)
	if err != nil {
		return bus.OrderReply{}, err
	}
	if err := l.rc.Do(ctx, l.rc.B().Hsetnx().Key(k.Home(o.UserID).Orders).Field(strconv.FormatUint(o.ID, 10)).Value(lua.EncodeRecord(&o)).Build()).Error(); err != nil {
		l.log.Warn("writing back an order Redis lost", "sale", cmd.SaleID, "order", o.ID, "err", err)
	}
	return reply(&o, "", ""), nil
}

// reply answers with code and the order as it now stands.
func reply(o *flashgate.Order, code flashgate.Code, msg string) bus.OrderReply {
	c := string(code)
	if code == "" {
		c = bus.ReplyOK
	}
	return bus.ReplyOf(c, msg, o)
}

// closed answers a command on an order that can no longer change that way.
func closed(o *flashgate.Order) bus.OrderReply {
	var msg string
	switch {
	case o.Status == flashgate.OrderPaid:
		msg = "paid orders cannot be canceled"
	case o.Status == flashgate.OrderCanceled && o.Reason == flashgate.ReasonExpired:
		msg = "the order expired unpaid"
	case o.Status == flashgate.OrderCanceled:
		msg = "the order was canceled"
	case o.Status == flashgate.OrderFailed:
		msg = "the order failed: " + o.Reason
	default:
		msg = "the order is closed"
	}
	return reply(o, flashgate.CodeOrderClosed, msg)
}

var notFound = bus.OrderReply{Code: string(flashgate.CodeOrderNotFound), Message: "no such order"}

var errNoOrder = mysql.ErrNoOrder

// lockOrder reads one order of sale and locks its row.
func lockOrder(ctx context.Context, tx *sql.Tx, sale string, id uint64) (flashgate.Order, error) {
	return mysql.LockOrder(ctx, tx, sale, id)
}

// absent answers a command on an order MySQL has no row of: one Redis still
// holds as pending is on its way (conflict: retry); anything else, like another
// user's order, is not found.
func (l *lifecycle) absent(ctx context.Context, cmd bus.OrderCommand) (bus.OrderReply, error) {
	k, err := keysOf(ctx, l.db, cmd.SaleID)
	if err != nil {
		return bus.OrderReply{}, err
	}
	rec, ok, err := lua.Order(ctx, l.rc, k.Home(cmd.UserID), cmd.OrderID)
	if err != nil {
		return bus.OrderReply{}, fmt.Errorf("order %d in redis: %w", cmd.OrderID, err)
	}
	if ok && rec.UserID == cmd.UserID && (rec.Status == lua.StatusPending || rec.Status == lua.StatusProcessing) {
		return bus.OrderReply{Code: string(flashgate.CodeConflict), Message: "order is still being confirmed; retry",
			Status: string(flashgate.OrderPending)}, nil
	}
	return notFound, nil
}

// retryTx runs fn until it succeeds, fails for good, or has run attempts times;
// deadlocks and lock wait timeouts are retried after a jittered back-off.
func retryTx[T any](ctx context.Context, attempts int, fn func() (T, error)) (T, error) {
	for attempt := 1; ; attempt++ {
		v, err := fn()
		if err == nil || attempt == attempts {
			return v, err
		}
		switch mysqlErrno(err) {
		case erLockDeadlock, erLockWaitTimeout:
		default:
			return v, err
		}
		d := txRetryBase << (attempt - 1)
		if err := sleep(ctx, d+rand.N(d)); err != nil {
			return v, err
		}
	}
}

// pay records a payment the gateway verified (POST /v1/payments) on a
// confirmed order before its deadline, with the payment's id and amount. The
// same payment again answers ok again; another payment of a paid order is
// already_paid; an amount other than price × quantity is amount_mismatch; a
// canceled, failed or expired order is closed (an expired one the sweeper has
// not reached yet is expired here and now), and the gateway tells the payment
// service to refund: no unit is ever taken back for a late payment. Whether
// the deadline passed is MySQL's clock's call, read in the transaction
// (invariant 8).
func (l *lifecycle) pay(ctx context.Context, cmd bus.OrderCommand) (bus.OrderReply, error) {
	p := cmd.Payment()
	// An order MySQL has no row of is answered before any lock: a payment
	// of a made-up id must not queue on the sale's row lock. (One written
	// just after this read was pending in Redis: absentPayment answers it
	// conflict, and the retry finds the row.)
	if _, err := mysql.Order(ctx, l.db, p.SaleID, p.OrderID); errors.Is(err, mysql.ErrNoOrder) {
		return l.absentPayment(ctx, p)
	} else if err != nil {
		return bus.OrderReply{}, fmt.Errorf("pay %d: %w", p.OrderID, err)
	}
	res, err := retryTx(ctx, commandRetries, func() (payResult, error) { return l.payTx(ctx, p) })
	if err != nil {
		return bus.OrderReply{}, err
	}
	o := res.o
	switch {
	case res.missing:
		return l.absentPayment(ctx, p)
	case res.refused != "":
		return reply(&o, res.refused, res.why), nil
	case res.expired:
		// Expire it now, under the sale lock like the sweeper (it may beat us
		// to it: then there is nothing left to do).
		if _, err := l.expireOrders(ctx, cmd.SaleID, []uint64{o.ID}, res.at); err != nil {
			l.log.Warn("expiring an order at payment", "sale", cmd.SaleID, "order", o.ID, "err", err) // the sweeper retries
		}
		o.Status, o.Reason = flashgate.OrderCanceled, flashgate.ReasonExpired
		return closed(&o), nil
	case o.Status == flashgate.OrderPaid:
		l.paidToRedis(ctx, o)
		return reply(&o, "", ""), nil
	default:
		return closed(&o), nil
	}
}

// payResult is what pay's transaction found: the order (as paid, when it
// paid it, or by this very payment before), none, one whose deadline passed,
// or a refusal of the payment (a code and why).
type payResult struct {
	o       flashgate.Order
	missing bool
	expired bool
	refused flashgate.Code
	why     string
	// at is MySQL's clock when the transaction judged the deadline.
	at time.Time
}

// payTx is one attempt at pay's transaction. It takes the sale row lock
// first, as every writer does (and reads the price under it), then the
// order's row.
func (l *lifecycle) payTx(ctx context.Context, p flashgate.Payment) (payResult, error) {
	tx, err := beginRC(ctx, l.db)
	if err != nil {
		return payResult{}, err
	}
	defer tx.Rollback()
	// No sale row: MySQL does not know the sale, so any order of it failed
	// (unknown_sale), and the order's row says so.
	price, _, err := mysql.LockSalePrice(ctx, tx, p.SaleID)
	if err != nil {
		return payResult{}, fmt.Errorf("pay %d: lock sale: %w", p.OrderID, err)
	}
	o, err := lockOrder(ctx, tx, p.SaleID, p.OrderID)
	if errors.Is(err, errNoOrder) {
		return payResult{missing: true}, nil
	}
	if err != nil {
		return payResult{}, err
	}
	if o.Status == flashgate.OrderPaid {
		return paidBefore(ctx, tx, o, p)
	}
	now, err := mysql.Now(ctx, tx)
	if err != nil {
		return payResult{}, fmt.Errorf("pay %d: clock: %w", o.ID, err)
	}
	paid := o
	if paid.Pay(now) != nil {
		// Not confirmed, or confirmed past its deadline: expired.
		return payResult{o: o, expired: o.Status == flashgate.OrderConfirmed, at: now}, nil
	}
	if due := price * o.Quantity; p.AmountCents != due {
		return payResult{o: o, refused: flashgate.CodeAmountMismatch,
			why: fmt.Sprintf("amount_cents %d, the order costs %d (%d units at %d)", p.AmountCents, due, o.Quantity, price)}, nil
	}
	if other, err := mysql.PaidOrderOf(ctx, tx, p.PaymentID); err != nil || other != 0 {
		return payResult{o: o, refused: flashgate.CodePaymentIDUsed, why: "this payment_id paid another order"}, err
	}
	if err := mysql.MarkPaid(ctx, tx, o.ID, mysql.Payment{ID: p.PaymentID, AmountCents: p.AmountCents}, now); err != nil {
		if mysqlErrno(err) == erDupEntry { // another order took the payment_id meanwhile
			return payResult{o: o, refused: flashgate.CodePaymentIDUsed, why: "this payment_id paid another order"}, nil
		}
		return payResult{}, fmt.Errorf("pay %d: %w", o.ID, err)
	}
	if err := tx.Commit(); err != nil {
		return payResult{}, fmt.Errorf("pay %d: commit: %w", o.ID, err)
	}
	return payResult{o: paid}, nil
}

// paidBefore answers a payment of an order already paid: the same payment
// (same id, same amount) is the same answer; anything else is refused.
func paidBefore(ctx context.Context, tx *sql.Tx, o flashgate.Order, p flashgate.Payment) (payResult, error) {
	prev, err := mysql.PaymentOf(ctx, tx, o.ID)
	switch {
	case err != nil:
		return payResult{}, fmt.Errorf("pay %d: %w", o.ID, err)
	case prev.ID != p.PaymentID:
		return payResult{o: o, refused: flashgate.CodeAlreadyPaid, why: "the order is paid by another payment_id"}, nil
	case prev.AmountCents != p.AmountCents:
		return payResult{o: o, refused: flashgate.CodeAmountMismatch,
			why: fmt.Sprintf("this payment_id paid %d, not %d", prev.AmountCents, p.AmountCents)}, nil
	}
	return payResult{o: o}, nil
}

// absentPayment answers a payment of an order MySQL has no row of: one Redis
// holds as pending (in any of the sale's buckets: a payment names no buyer)
// is on its way (conflict: retry); anything else is not found.
func (l *lifecycle) absentPayment(ctx context.Context, p flashgate.Payment) (bus.OrderReply, error) {
	k, err := keysOf(ctx, l.db, p.SaleID)
	if err != nil {
		return bus.OrderReply{}, err
	}
	homes := k.Buckets()
	if len(homes) == 0 {
		homes = []*lua.Keys{k}
	}
	for _, h := range homes {
		rec, ok, err := lua.Order(ctx, l.rc, h, p.OrderID)
		if err != nil {
			return bus.OrderReply{}, fmt.Errorf("order %d in redis: %w", p.OrderID, err)
		}
		if ok && (rec.Status == lua.StatusPending || rec.Status == lua.StatusProcessing) {
			return bus.OrderReply{Code: string(flashgate.CodeConflict), Message: "order is still being confirmed; retry",
				Status: string(flashgate.OrderPending)}, nil
		}
	}
	return notFound, nil
}

// paidToRedis tells Redis the order is paid, now or before (again: it heals a
// write-back a crash or a late confirm lost), unless retention removed the
// sale. It runs even when the command's own time is up.
func (l *lifecycle) paidToRedis(ctx context.Context, o flashgate.Order) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), redisTimeout)
	defer cancel()
	if retired(rctx, l.db, o.SaleID) {
		return
	}
	k, err := epochKeys(rctx, l.db, o.SaleID)
	if err == nil {
		err = l.scripts.MarkPaid(rctx, l.rc, k, o)
	}
	if err != nil && !errors.Is(err, lua.ErrStaleEpoch) {
		l.log.Warn("paid status to redis", "sale", o.SaleID, "order", o.ID, "err", err)
	}
}

// cancel cancels a confirmed order for its buyer and gives its units back.
// Canceling a canceled order answers ok again (its units are not returned
// twice); a paid or failed order is closed.
func (l *lifecycle) cancel(ctx context.Context, cmd bus.OrderCommand, now time.Time) (bus.OrderReply, error) {
	// Whose order it is, and whether it exists, is read before any lock: an
	// order's buyer never changes, so someone else's order, or one that does
	// not exist, is answered without queuing on the sale's row lock that
	// every order of the sale needs (a flood of made-up ids would otherwise
	// hold up the sale's batches, payments and real cancels).
	switch o, err := mysql.Order(ctx, l.db, cmd.SaleID, cmd.OrderID); {
	case errors.Is(err, mysql.ErrNoOrder):
		return l.absent(ctx, cmd)
	case err != nil:
		return bus.OrderReply{}, fmt.Errorf("cancel %d: %w", cmd.OrderID, err)
	case o.UserID != cmd.UserID:
		return notFound, nil
	}
	type result struct {
		o       flashgate.Order
		missing bool
	}
	res, err := retryTx(ctx, commandRetries, func() (result, error) {
		tx, err := beginRC(ctx, l.db)
		if err != nil {
			return result{}, err
		}
		defer tx.Rollback()
		// The sale row first, as the batch writer takes it. No row: the sale is
		// unknown to MySQL, and so any order of it failed (unknown_sale).
		if _, err := mysql.LockSale(ctx, tx, cmd.SaleID); err != nil {
			return result{}, fmt.Errorf("cancel %d: lock sale: %w", cmd.OrderID, err)
		}
		o, err := lockOrder(ctx, tx, cmd.SaleID, cmd.OrderID)
		if errors.Is(err, errNoOrder) {
			return result{missing: true}, nil
		}
		if err != nil || o.UserID != cmd.UserID || o.Cancel() != nil {
			return result{o: o}, err
		}
		if err := returnUnits(ctx, tx, cmd.SaleID, []flashgate.Order{o}, flashgate.ReasonCanceled, now); err != nil {
			return result{}, fmt.Errorf("cancel %d: %w", o.ID, err)
		}
		if err := tx.Commit(); err != nil {
			return result{}, fmt.Errorf("cancel %d: commit: %w", o.ID, err)
		}
		return result{o: o}, nil
	})
	if err != nil {
		return bus.OrderReply{}, err
	}
	o := res.o
	switch {
	case res.missing:
		return l.absent(ctx, cmd)
	case o.UserID != cmd.UserID:
		return notFound, nil
	case o.Status == flashgate.OrderCanceled:
		// Canceled now, or before (by the buyer or the sweeper): restock is
		// idempotent, so running it again heals a Redis step that failed.
		if !retired(ctx, l.db, o.SaleID) {
			l.restock(ctx, o.SaleID, []flashgate.Order{o})
		}
		return reply(&o, "", ""), nil
	default:
		return closed(&o), nil
	}
}

// returnUnits cancels orders (confirmed, locked, of sale, whose row the caller
// holds) with reason and gives their units back to every counter.
func returnUnits(ctx context.Context, tx *sql.Tx, sale string, orders []flashgate.Order, reason string, now time.Time) error {
	return mysql.ReturnUnits(ctx, tx, sale, orders, reason, now)
}

// restock gives the units of orders MySQL has canceled back to Redis and tells
// the gateways. It runs after the commit, so it only logs a failure: MySQL is
// the truth, and running it again (a repeated cancel, reconcile's
// restockCanceled) is safe. It answers how many orders' units went back.
func (l *lifecycle) restock(ctx context.Context, sale string, orders []flashgate.Order) int {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), redisTimeout)
	defer cancel()
	n, err := l.restockOrders(ctx, sale, orders)
	if err != nil {
		l.log.Error("restock in redis failed; a retried cancel or reconcile repairs it", "sale", sale,
			"orders", len(orders), "restocked", n, "err", err)
	}
	return n
}

// restockOrders runs lua.RestockMany over orders (canceled in MySQL) in calls of
// sweepChunk, and publishes one restocked event per region that got units back.
func (l *lifecycle) restockOrders(ctx context.Context, sale string, orders []flashgate.Order) (int, error) {
	k, err := epochKeys(ctx, l.db, sale)
	if err != nil {
		return 0, err
	}
	back := map[string]bool{}
	n := 0
	for part := range slices.Chunk(orders, sweepChunk) {
		batch := make([]flashgate.Order, len(part))
		for i, o := range part {
			batch[i] = o
		}
		var out []lua.RestockOutcome
		if out, err = l.scripts.RestockMany(ctx, l.rc, k, batch); err != nil {
			break
		}
		for i, r := range out {
			if r == lua.Restocked {
				back[part[i].Region] = true
				n++
			}
		}
	}
	for _, region := range sortedKeys(back) {
		l.events.publish(bus.SaleEvent{Type: bus.EventRestocked, SaleID: sale, Region: region})
	}
	return n, err
}

// restockCanceled runs the Redis half of a cancel again for every order of sale
// canceled (or expired) in MySQL since then (zero: all of them): the units of
// those whose restock never ran (a backend died after the commit, Redis was
// away) go back now, the others only get their record rewritten. It is
// reconcile's repair for "MySQL canceled, Redis still holds the units"; run it
// BEFORE setting stock from MySQL (under the sale row lock), so the orders are
// marked settled and a late restock cannot add their units on top of the new
// stock. It answers how many orders' units went back.
func (l *lifecycle) restockCanceled(ctx context.Context, sale string, since time.Time) (int, error) {
	n := 0
	batch := make([]flashgate.Order, 0, sweepChunk)
	flush := func() error {
		m, err := l.restockOrders(ctx, sale, batch)
		n += m
		batch = batch[:0]
		return err
	}
	var flushErr error
	err := mysql.EachCanceledSince(ctx, l.db, sale, since, func(o flashgate.Order) error {
		if batch = append(batch, o); len(batch) == sweepChunk {
			if flushErr = flush(); flushErr != nil {
				return flushErr
			}
		}
		return nil
	})
	if flushErr != nil {
		return n, flushErr
	}
	if err != nil {
		return n, fmt.Errorf("canceled orders of %s: %w", sale, err)
	}
	return n, flush()
}

// expireOrders expires those of ids (orders of sale) that are still confirmed
// and past their deadline at now, in one transaction under the sale row lock,
// then restocks them. It answers how many it expired: an order paid, canceled
// or expired meanwhile (by another sweeper) is left alone.
func (l *lifecycle) expireOrders(ctx context.Context, sale string, ids []uint64, now time.Time) (int, error) {
	orders, err := l.expireTx(ctx, sale, ids, now)
	if err != nil || len(orders) == 0 {
		return 0, err
	}
	l.restock(ctx, sale, orders)
	return len(orders), nil
}

// expireTx is the MySQL half of expireOrders: it answers the orders it expired.
func (l *lifecycle) expireTx(ctx context.Context, sale string, ids []uint64, now time.Time) ([]flashgate.Order, error) {
	return retryTx(ctx, txRetries, func() ([]flashgate.Order, error) {
		tx, err := beginRC(ctx, l.db)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback()
		found, err := mysql.LockSale(ctx, tx, sale)
		if err != nil {
			return nil, fmt.Errorf("expire %s: lock sale: %w", sale, err)
		}
		if !found {
			return nil, nil // no sale, so none of its orders is confirmed
		}
		orders, err := mysql.LockExpired(ctx, tx, sale, ids, now)
		if err != nil {
			return nil, fmt.Errorf("expire %s: %w", sale, err)
		}
		for i := range orders {
			orders[i].Status, orders[i].Reason = flashgate.OrderCanceled, flashgate.ReasonExpired
		}
		if len(orders) == 0 {
			return nil, nil
		}
		if err := returnUnits(ctx, tx, sale, orders, flashgate.ReasonExpired, now); err != nil {
			return nil, fmt.Errorf("expire %s: %w", sale, err)
		}
		if err := tx.Commit(); err != nil {
			return nil, fmt.Errorf("expire %s: commit: %w", sale, err)
		}
		if l.metrics != nil {
			l.metrics.Expired(len(orders))
		}
		return orders, nil
	})
}

// sweepExpired expires up to limit confirmed orders whose payment deadline is
// at or before now, oldest deadline first, sale by sale in transactions of up to
// sweepChunk orders. It answers how many it expired. Sweepers may run at once
// (a leader hand-over): each order is expired by one of them.
func (l *lifecycle) sweepExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	sales, bySale, err := mysql.DueOrders(ctx, l.db, now, limit)
	if err != nil {
		return 0, fmt.Errorf("sweep: %w", err)
	}
	// One chunk's Redis restock runs while the next chunk's transaction does
	// (a quarter of a chunk's time): at most one restock at a time.
	var restocking sync.WaitGroup
	defer restocking.Wait()
	expired := 0
	var errs []error
	for _, sale := range sales {
		for part := range slices.Chunk(bySale[sale], sweepChunk) {
			orders, err := l.expireTx(ctx, sale, part, now)
			if err != nil {
				if ctx.Err() != nil {
					return expired, err
				}
				errs = append(errs, err) // the next pass retries it; other sales go on
				break
			}
			expired += len(orders)
			restocking.Wait()
			if len(orders) > 0 {
				restocking.Go(func() { l.restock(ctx, sale, orders) })
			}
		}
	}
	return expired, errors.Join(errs...)
}

// runSweeper expires unpaid orders every interval until ctx ends, taking the
// whole backlog at once. Only the leader runs it (one sweeper suffices, though
// two at once do no harm).
func (l *lifecycle) runSweeper(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		for {
			start := time.Now()
			n, err := l.sweepExpired(ctx, start, sweepLimit)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				l.log.Error("expiry sweep", "expired", n, "err", err)
			}
			if n > 0 {
				l.log.Info("expired unpaid orders", "orders", n, "took", time.Since(start))
			}
			if err != nil || n < sweepLimit {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
