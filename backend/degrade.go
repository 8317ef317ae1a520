package backend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/tick"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
	"github.com/flashgate/flashgate/orderid"
)

// The degraded lane's backend half (docs/degrade.md): any backend decides the
// lane's purchases in MySQL (serveLane); the leader warms a stale sale again
// from MySQL once Redis answers, and tells the gateways the fast path may
// resume (rewarmLoop).

const (
	// laneWorkers is how many subscriptions of the lane's queue group a
	// backend holds: purchases of different sales go on at once; those of one
	// sale queue on its row lock anyway.
	laneWorkers = 8
	// laneTimeout bounds one lane decision (the gateway waits laneTimeout too).
	laneTimeout = 3 * time.Second
	// laneFlightEvery: the lane reads the orders in the stream (admitted by
	// Redis before it went away) at most this often per sale.
	laneFlightEvery = 2 * time.Second
	// redisProbeEvery: how fresh the lane's word on Redis is.
	redisProbeEvery = 250 * time.Millisecond
	redisProbeWait  = 300 * time.Millisecond
	// rewarmEvery is the leader's look for stale sales.
	rewarmEvery = 500 * time.Millisecond
	// rewarmTimeout bounds one rewarm, the sale row lock held throughout.
	rewarmTimeout = 10 * time.Second
	// staleEventEvery: a backend tells the gateways a sale went stale at most
	// this often (each lane order marks it; the gateway that sent it knows).
	staleEventEvery = time.Second
)

// lane decides degraded purchases.
type lane struct {
	db     *sql.DB
	rc     rueidis.Client
	nc     *nats.Conn
	cfg    config.NATS
	log    *slog.Logger
	stream *orderStream
	events *saleEvents
	now    func() time.Time

	subs []*nats.Subscription
	wg   sync.WaitGroup
	stop atomic.Bool

	probes sync.Map // sale → *shardProbe: the sale's Redis shard, as last probed

	// node is the lane's order-id node (a MySQL lock), gen its ids; nil
	// while none is held (the lane then answers unavailable).
	node atomic.Pointer[laneNode]

	mu     sync.Mutex
	flight map[string]*laneFlight
	stale  map[string]time.Time // last stale event sent per sale
}

// shardProbe is the lane's word on one sale's Redis shard.
type shardProbe struct {
	up      atomic.Bool  // the shard answered the last probe
	probeAt atomic.Int64 // unix ns of the last probe begun
	probing atomic.Bool
}

// laneFlight is one sale's orders in the stream, as last read; mu is held
// while they are read again, so one read serves every purchase waiting.
type laneFlight struct {
	mu     sync.Mutex
	at     time.Time
	orders []flashgate.Order
}

func newLane(b *Backend) *lane {
	return &lane{db: b.db, rc: b.rc, nc: b.nc, cfg: b.opts.NATS, log: b.log.With("part", "lane"), stream: b.rec.stream,
		events: b.events, now: time.Now, flight: map[string]*laneFlight{}, stale: map[string]time.Time{}}
}

// laneNode is a held lane node and its generator.
type laneNode struct {
	*mysql.LaneNode
	gen *orderid.Generator
}

// laneNodeCheck is how often the lane checks its node's lock is still held.
const laneNodeCheck = 500 * time.Millisecond

// keepNode leases a lane order-id node in MySQL and checks it every
// laneNodeCheck, leasing another when it is lost (the MySQL session died),
// until ctx ends.
func (l *lane) keepNode(ctx context.Context) {
	t := time.NewTicker(laneNodeCheck)
	defer t.Stop()
	for {
		cur := l.node.Load()
		if cur != nil && !cur.Held(ctx) {
			l.log.Warn("lane order-id node lost", "node", cur.Node)
			l.node.Store(nil)
			_ = cur.Close()
			cur = nil
		}
		if cur == nil && ctx.Err() == nil {
			n, err := mysql.LeaseLaneNode(ctx, l.db, orderid.LeasedNodes, orderid.LaneNodes)
			if err != nil {
				l.log.Warn("lane order-id node", "err", err)
			} else {
				l.node.Store(&laneNode{LaneNode: n, gen: orderid.New(n.Node)})
			}
		}
		select {
		case <-ctx.Done():
			if n := l.node.Swap(nil); n != nil {
				_ = n.Close()
			}
			return
		case <-t.C:
		}
	}
}

// serve joins the lane's queue group laneWorkers times.
func (l *lane) serve() error {
	for range laneWorkers {
		sub, err := bus.ServePurchases(l.nc, l.cfg, l.handle)
		if err != nil {
			l.close()
			return fmt.Errorf("degraded lane: %w", err)
		}
		l.subs = append(l.subs, sub)
	}
	return l.nc.Flush()
}

// close leaves the queue group and waits for the decisions in hand.
func (l *lane) close() {
	if l == nil {
		return
	}
	l.stop.Store(true)
	for _, s := range l.subs {
		_ = s.Unsubscribe()
	}
	l.wg.Wait()
}

func (l *lane) handle(p bus.LanePurchase) bus.LaneReply {
	l.wg.Add(1)
	defer l.wg.Done()
	if l.stop.Load() {
		return bus.LaneReply{Outcome: bus.LaneUnavailable, Message: "backend shutting down; retry"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), laneTimeout)
	defer cancel()
	r, err := l.decide(ctx, p)
	if err != nil {
		l.log.Warn("lane purchase undecided", "sale", p.SaleID, "user", p.UserID, "err", err)
		return bus.LaneReply{Outcome: bus.LaneUnavailable, Message: "order store unavailable"}
	}
	return r
}

// decide runs one purchase through MySQL.
func (l *lane) decide(ctx context.Context, p bus.LanePurchase) (bus.LaneReply, error) {
	node := l.node.Load()
	if node == nil {
		return bus.LaneReply{Outcome: bus.LaneUnavailable, Message: "order ids unavailable"}, nil
	}
	in := mysql.LanePurchase{Order: p.Order(), RedisUp: l.redisUp(p.SaleID), NextID: node.gen.Next}
	var err error
	if in.InFlight, err = l.inFlight(ctx, p.SaleID); err != nil {
		return bus.LaneReply{}, err
	}
	res, err := mysql.DecideDegraded(ctx, l.db, in, l.now())
	if err != nil {
		return bus.LaneReply{}, err
	}
	if res.Outcome == flashgate.LaneAdmitted {
		l.staleEvent(p.SaleID)
	}
	return bus.LaneReply{Outcome: string(res.Outcome), OrderID: res.OrderID, Status: string(res.Status),
		Remaining: res.Remaining, WaitMS: res.Wait.Milliseconds(), Limit: res.Limit, Held: res.Held}, nil
}

// staleEvent tells the gateways the sale is stale, at most every
// staleEventEvery from this backend.
func (l *lane) staleEvent(sale string) {
	l.mu.Lock()
	now := l.now()
	due := now.Sub(l.stale[sale]) >= staleEventEvery
	if due {
		l.stale[sale] = now
	}
	l.mu.Unlock()
	if due {
		l.events.publish(bus.SaleEvent{Type: bus.EventStale, SaleID: sale})
	}
}

// inFlight is the sale's orders in the stream, read at most every
// laneFlightEvery: while Redis is away the writer cannot claim them, so they
// wait there, and the lane holds their units back.
func (l *lane) inFlight(ctx context.Context, sale string) ([]flashgate.Order, error) {
	l.mu.Lock()
	f := l.flight[sale]
	if f == nil {
		f = &laneFlight{}
		l.flight[sale] = f
	}
	l.mu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.at.IsZero() && l.now().Sub(f.at) < laneFlightEvery {
		return f.orders, nil
	}
	msgs, err := l.stream.streamOrders(ctx, sale)
	if err != nil {
		return nil, fmt.Errorf("orders in flight: %w", err)
	}
	orders := make([]flashgate.Order, 0, len(msgs))
	for _, m := range msgs {
		orders = append(orders, m)
	}
	f.at, f.orders = l.now(), orders
	return orders, nil
}

// redisUp is the last probe's word on the sale's Redis shard (a read of its
// meta key, which lives there). A probe older than redisProbeEvery starts a
// new one in the background: a stopped Redis makes a probe wait its whole
// timeout, which no purchase should. The sale's first purchase waits for its
// first probe (a lane that took Redis for away would decide purchases the
// fast path should).
func (l *lane) redisUp(sale string) bool {
	v, loaded := l.probes.Load(sale)
	if !loaded {
		v, loaded = l.probes.LoadOrStore(sale, &shardProbe{})
	}
	p := v.(*shardProbe)
	probe := func() {
		defer p.probing.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), redisProbeWait)
		defer cancel()
		p.up.Store(l.rc.Do(ctx, l.rc.B().Exists().Key(lua.KeysFor(sale, nil).Meta).Build()).Error() == nil)
	}
	now := l.now().UnixNano()
	if now-p.probeAt.Load() >= int64(redisProbeEvery) && p.probing.CompareAndSwap(false, true) {
		p.probeAt.Store(now)
		if !loaded {
			probe()
		} else {
			go probe()
		}
	}
	return p.up.Load()
}

// rewarmLoop is the leader's: every rewarmEvery it warms each stale sale
// again from MySQL, if Redis answers, until ctx (the leader lock's) ends.
func (b *Backend) rewarmLoop(ctx context.Context) {
	tick.Every(ctx, rewarmEvery, func(time.Time) {
		stale, err := mysql.StaleSales(ctx, b.db)
		if err != nil {
			if ctx.Err() == nil {
				b.log.Warn("rewarm: listing stale sales", "err", err)
			}
			return
		}
		for id := range stale {
			rctx, cancel := context.WithTimeout(ctx, rewarmTimeout)
			did, err := b.rewarm(rctx, id)
			cancel()
			switch {
			case err != nil && ctx.Err() == nil:
				b.log.Warn("rewarm of a stale sale", "sale", id, "err", err)
			case did:
				b.log.Info("stale sale warmed again from MySQL: the fast path resumes", "sale", id)
			}
		}
	})
}

// errRewarmBusy: another backend holds the sale's warm lock.
var errRewarmBusy = errors.New("warm lock held")

// rewarm makes Redis hold what MySQL holds of a stale sale, and marks it fresh.
// It holds the sale row lock throughout, so no order of the sale (lane,
// stream, cancel) commits meanwhile, and the warm lock, so no other warm
// runs. Redis must count as reserved every order it or the stream holds that
// MySQL has not written: units held, then either confirmed (nothing moves) or
// failed (release gives them back, once).
//
//  1. meta deleted: every admission answers not_warmed (gateways answer 503,
//     and those that know the sale is stale do not ask Redis at all);
//  2. the pending orders: Redis's reservations and the stream's messages
//     without a MySQL row;
//  3. users hash = MySQL's units + pending; limit counters = MySQL's +
//     pending; every MySQL order's record and Idempotency-Key (HSETNX);
//  4. stock = total − sold − pending, per region; meta written (lua.Warm);
//  5. stale = 0 in the same transaction; commit; EventFresh.
func (b *Backend) rewarm(ctx context.Context, sale string) (bool, error) {
	if err := b.rc.Do(ctx, b.rc.B().Exists().Key(lua.KeysFor(sale, nil).Meta).Build()).Error(); err != nil {
		return false, nil // the sale's shard is still away: the lane goes on
	}
	tx, err := mysql.Begin(ctx, b.db)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	n, err := mysql.LockStale(ctx, tx, sale)
	if err != nil || n == 0 {
		return false, err
	}
	row, err := loadSale(ctx, tx, sale)
	if err != nil {
		return false, err
	}
	k := lua.KeysFor(sale, row.RegionNames())
	token := randomToken()
	lock := warmLockKey(sale)
	err = b.rc.Do(ctx, b.rc.B().Set().Key(lock).Value(token).Nx().Px(warmLockTTL).Build()).Error()
	if rueidis.IsRedisNil(err) {
		return false, errRewarmBusy
	}
	if err != nil {
		return false, fmt.Errorf("lock: %w", err)
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = b.warmer.unlock.Exec(uctx, b.rc, []string{lock}, []string{token}).Error()
	}()
	if err := b.rc.Do(ctx, b.rc.B().Del().Key(k.Meta).Build()).Error(); err != nil {
		return false, fmt.Errorf("unwarm: %w", err)
	}
	pending, err := b.pendingOrders(ctx, tx, k)
	if err != nil {
		return false, err
	}
	if err := b.refill(ctx, tx, row, k, pending); err != nil {
		return false, err
	}
	if err := mysql.ClearStale(ctx, tx, sale); err != nil {
		return false, err
	}
	if err := tx.Commit(); err != nil {
		// Redis is warm and the sale still stale: the next look warms it again.
		return false, fmt.Errorf("commit: %w", err)
	}
	b.events.publish(bus.SaleEvent{Type: bus.EventFresh, SaleID: sale})
	return true, nil
}

// pendingOrders are the orders Redis reserved or the stream holds that MySQL
// has no row of (read under the sale row lock: none is written meanwhile).
func (b *Backend) pendingOrders(ctx context.Context, tx *sql.Tx, k *lua.Keys) ([]flashgate.Order, error) {
	resv, err := lua.Reservations(ctx, b.rc, k)
	if err != nil {
		return nil, err
	}
	msgs, err := b.rec.stream.streamOrders(ctx, k.Sale)
	if err != nil {
		return nil, fmt.Errorf("stream: %w", err)
	}
	for id, m := range msgs {
		if _, ok := resv[id]; !ok {
			resv[id] = m
		}
	}
	ids := make([]uint64, 0, len(resv))
	for id := range resv {
		ids = append(ids, id)
	}
	rows, err := orderRows(ctx, tx, k.Sale, ids)
	if err != nil {
		return nil, err
	}
	var out []flashgate.Order
	for id, o := range resv {
		if _, written := rows[id]; !written {
			out = append(out, o)
		}
	}
	return out, nil
}

// refill writes the sale into Redis from MySQL (read in tx) and the pending
// orders, meta last.
func (b *Backend) refill(ctx context.Context, tx *sql.Tx, row *saleRow, k *lua.Keys, pending []flashgate.Order) error {
	w := b.warmer
	if err := w.rebuildUsers(ctx, tx, k); err != nil {
		return fmt.Errorf("users: %w", err)
	}
	if err := w.rebuildLimits(ctx, tx, k, &row.Sale); err != nil {
		return fmt.Errorf("limits: %w", err)
	}
	if err := w.rebuildOrders(ctx, k); err != nil {
		return fmt.Errorf("orders: %w", err)
	}
	rem := row.Remaining()
	var cmds rueidis.Commands
	for _, o := range pending {
		if _, ok := rem[o.Region]; !ok {
			continue // a region the sale lacks: MySQL fails it, it holds nothing
		}
		rem[o.Region] -= o.Quantity
		cmds = append(cmds, b.rc.B().Hincrby().Key(k.Users).Field(o.UserID).Increment(o.Quantity).Build())
		cs, err := flashgate.ParseCharges(o.Charges)
		if err != nil {
			continue
		}
		for _, c := range cs {
			cmds = append(cmds, b.rc.B().Hincrby().Key(k.Limit(c.Window)).Field(c.Field()).Increment(c.Inc).Build())
		}
	}
	for _, r := range b.rc.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("pending orders: %w", err)
		}
	}
	did, err := b.scripts.Warm(ctx, b.rc, &row.Sale, rem)
	if err != nil {
		return err
	}
	if !did {
		return errors.New("warm: meta came back while the warm lock was held")
	}
	b.log.Info("stale sale refilled", "sale", row.ID, "pending", strconv.Itoa(len(pending)), "sold", row.Sold)
	return nil
}

// serveLane leases the lane's order-id node (waiting up to a few seconds for
// it: a purchase on the lane needs it) and joins the lane's queue group.
func (b *Backend) serveLane() error {
	b.lane = newLane(b)
	ctx, cancel := context.WithCancel(context.Background())
	b.stopLane = cancel
	b.wg.Go(func() { b.lane.keepNode(ctx) })
	return b.lane.serve()
}

// stopLaneServing leaves the lane's queue group, waits for the decisions in
// hand and frees the order-id node.
func (b *Backend) stopLaneServing() {
	if b.lane == nil {
		return
	}
	b.lane.close()
	b.stopLane()
}
