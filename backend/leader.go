package backend

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis/rueidislock"

	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics"
)

// Leader election (docs/design.md §8). The background work that must run on exactly
// one backend at a time, the reconciler, the expiry sweeper and the order-events
// publisher (outbox.go), runs under a
// Redis lock (rueidislock) that renews itself every half validity and whose
// context is cancelled the moment the lock is lost: Redis gone, the key
// deleted, or a renewal that found the key taken. The work stops with that
// context; the backend then queues for the lock again. A leader that dies
// without releasing (kill -9) holds the lock at most leaderValidity longer.
//
// The lock is named after the durable consumer: the backends sharing one
// consumer are one group, with one leader. (Two groups on one Redis, as tests
// run them, do not elect each other.)

const (
	// leaderKeyPrefix prefixes the lock key: <prefix>:0:<consumer>. With
	// KeyMajority 1 the lock is this one key (on one shard of a Cluster).
	leaderKeyPrefix = lua.LeaderLockPrefix
	// leaderValidity is how long the lock outlives a leader that stopped
	// renewing it; renewals come every half of it.
	leaderValidity = 5 * time.Second
	// reconcileEvery is how often the leader reconciles every recent sale.
	reconcileEvery = 5 * time.Second
	// electionRetry paces attempts to queue for the lock after an error.
	electionRetry = time.Second
)

// leaderSweepEvery is how often the leader's expiry sweeper runs; 0: the
// leader runs none (this package's tests drive the sweeper themselves and
// count what it expired, which the leader's own would race).
var leaderSweepEvery = time.Second

// leadership is one backend's part in the election.
type leadership struct {
	locker rueidislock.Locker
	name   string
	is     atomic.Bool
	stop   context.CancelFunc
	done   chan struct{}
}

// opsMetrics counts what the leader and the dead-letter path do. They live on
// the backend's registry, beside metrics.Backend's collectors.
type opsMetrics struct {
	leader       prometheus.Gauge
	elected      prometheus.Counter
	deadLetters  *prometheus.CounterVec
	waiting      prometheus.Gauge
	held         prometheus.Counter
	probes       prometheus.Counter
	reconciles   *prometheus.CounterVec
	republished  prometheus.Counter
	stockRepairs prometheus.Counter
}

func newOpsMetrics(reg prometheus.Registerer) *opsMetrics {
	const ns, sub = "flashgate", "backend"
	m := &opsMetrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "leader",
			Help: "1 while this backend holds the leader lock (runs the reconciler and the expiry sweeper)."}),
		elected: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "leader_elections_total",
			Help: "Times this backend took the leader lock."}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "dead_letters_total",
			Help: "Order messages moved to the dead-letter stream, by kind (poison: failed every delivery; unparseable)."}, []string{"kind"}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "orders_waiting",
			Help: "Order messages this backend holds until a dependency of their sale (MySQL, its Redis tags, NATS) answers writes again."}),
		held: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "outage_holds_total",
			Help: "Order messages put on hold because a dependency of their sale could not write (no delivery spent)."}),
		probes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "outage_probes_total",
			Help: "Write probes of the dependencies of sales whose orders wait (every 0.25 s doubling to 2 s per waiting sale)."}),
		reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "reconciles_total",
			Help: "Sale reconciliations, by result (ok, error)."}, []string{"result"}),
		republished: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "republished_total",
			Help: "Stale reservations whose order MySQL lacked, published again by reconcile (same message id)."}),
		stockRepairs: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "stock_repairs_total",
			Help: "Stock keys reconcile set from MySQL (ledger repairs and restored keys)."}),
	}
	m.deadLetters.WithLabelValues(bus.DeadPoison)
	m.deadLetters.WithLabelValues(bus.DeadUnparseable)
	m.reconciles.WithLabelValues("ok")
	m.reconciles.WithLabelValues("error")
	reg.MustRegister(m.leader, m.elected, m.deadLetters, m.waiting, m.held, m.probes, m.reconciles, m.republished, m.stockRepairs)
	return m
}

// prepareOps readies what the dead-letter path, reconcile and the leader need
// before the consumer and the warms start: the JetStream handle, the
// dead-letter stream, the metrics, the in-flight count for warms.
func (b *Backend) prepareOps(ctx context.Context, js jetstream.JetStream) error {
	b.js = js
	if _, err := bus.EnsureDeadLetterStream(ctx, js, b.opts.NATS); err != nil {
		return err
	}
	b.ops = newOpsMetrics(b.metrics.Registry())
	if _, err := bus.EnsureOrderEventStream(ctx, js, b.opts.Events, b.opts.NATS.Replicas); err != nil {
		return err
	}
	b.outbox = &eventPublisher{db: b.db, js: js, cfg: b.opts.Events, log: b.log, metrics: newEventMetrics(b.metrics.Registry())}
	var err error
	if b.webhook, err = newWebhook(ctx, js, b.opts.Events, b.opts.NATS.Replicas, b.log, b.metrics.Registry()); err != nil {
		return err
	}
	b.rec = &reconciler{
		cfg: reconcileConfig{NATS: b.opts.NATS, PublishTimeout: b.opts.PublishTimeout, WaitReplicas: b.opts.WaitReplicas, WaitTimeout: b.opts.WaitTimeout}, log: b.log, db: b.db, rc: b.rc, js: js,
		stream:  &orderStream{js: js, nats: b.opts.NATS},
		scripts: b.scripts, ops: b.ops, writer: b.writer, warmer: b.warmer, life: b.life, events: b.events,
	}
	b.retain = &retainer{db: b.db, rc: b.rc, nc: b.nc, nats: b.opts.NATS, retention: b.opts.Retention,
		log: b.log, metrics: newRetentionMetrics(b.metrics.Registry()), stream: b.rec.stream}
	b.live = newLive(b.rec, metrics.NewSales(b.metrics.Registry()), b.log)
	b.warmer.stream = b.rec.stream
	b.warmer.grace = b.rec.lossGrace
	return nil
}

// startLeading joins the election: a goroutine queues for the lock and runs the
// leader's work while it holds it, until stopLeading.
func (b *Backend) startLeading() error {
	locker := b.locker
	if locker == nil {
		return errors.New("leader lock: no locker (Deps.Locker)")
	}
	ctx, stop := context.WithCancel(context.Background())
	b.leader = &leadership{locker: locker, name: b.opts.NATS.Consumer, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(b.leader.done)
		b.lead(ctx)
	}()
	return nil
}

// electionPoll is how often a follower tries to take the leader lock.
const electionPoll = 250 * time.Millisecond

// lockAttemptTimeout bounds one attempt to take or extend the leader lock.
const lockAttemptTimeout = 500 * time.Millisecond

// LeaderLockerOption is the leader lock's locker, but for its client (the
// caller dials it with internal/dial's Locker): one key (KeyMajority 1: one
// Redis, or one shard of a Cluster), renewed every validity/2, watched with
// client-side caching so that a deleted or taken key cancels the holder's
// context at once and wakes those queuing.
func LeaderLockerOption(validity time.Duration) rueidislock.LockerOption {
	return rueidislock.LockerOption{
		KeyPrefix:   leaderKeyPrefix,
		KeyValidity: validity,
		KeyMajority: 1,
		// rueidislock's per-attempt timeout (default 20 ms): on a loaded
		// machine a round trip takes longer, and leadership would flap.
		TryNextAfter: lockAttemptTimeout,
		// Without NOLOOP the holder is told of its own renewals: each
		// renewal's write invalidates the key it tracks, which triggers the
		// next renewal at once. The leader then renewed ~8,500 times a second
		// (half a core of the backend, a tenth of Redis) instead of every
		// validity/2. Others' writes (the key deleted or taken) still reach it.
		NoLoopTracking: true,
	}
}

// LeaderValidity is how long the leader lock outlives a leader that stopped
// renewing it, for LeaderLockerOption.
const LeaderValidity = leaderValidity

// stopLeading stops the leader's work, releases the lock (the next backend
// takes it at once, not after its validity) and leaves the election.
func (b *Backend) stopLeading() {
	if b.leader == nil {
		return
	}
	b.leader.stop()
	<-b.leader.done
	b.leader.locker.Close()
}

// IsLeader reports whether this backend holds the leader lock now.
func (b *Backend) IsLeader() bool { return b.leader != nil && b.leader.is.Load() }

// lead queues for the leader lock and, while holding it, runs the leader's
// work under the lock's context; when the lock is lost the work stops and it
// queues again, until ctx ends. It releases the lock on the way out.
func (b *Backend) lead(ctx context.Context) {
	l := b.leader
	for ctx.Err() == nil {
		// Poll rather than wait for the lock's key to change: WithContext
		// waits for a client-side-cache invalidation with no timer, and one
		// missed message (a reconnect) would leave this backend waiting for
		// good. A poll bounds a takeover by the lock's validity plus electionPoll.
		lctx, release, err := l.locker.TryWithContext(ctx, l.name)
		if err != nil {
			switch {
			case ctx.Err() != nil || errors.Is(err, rueidislock.ErrLockerClosed):
				return
			case errors.Is(err, rueidislock.ErrNotLocked):
				_ = sleep(ctx, electionPoll) // another backend leads
			default:
				b.log.Warn("leader election", "err", err)
				_ = sleep(ctx, electionRetry)
			}
			continue
		}
		began := time.Now()
		l.is.Store(true)
		b.ops.leader.Set(1)
		b.ops.elected.Inc()
		b.log.Info("leading: reconciler and expiry sweeper run here", "lock", lua.LeaderLock(l.name))
		b.leaderWork(lctx)
		l.is.Store(false)
		b.ops.leader.Set(0)
		release()
		if ctx.Err() != nil {
			b.log.Info("leadership released", "led", time.Since(began).Round(time.Millisecond))
			return
		}
		b.log.Warn("leadership lost: leader work stopped", "led", time.Since(began).Round(time.Millisecond))
	}
}

// leaderWork runs the leader's loops until ctx (the lock's) ends, and returns
// when all of them have.
func (b *Backend) leaderWork(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { b.rec.reconcileLoop(ctx) })
	wg.Go(func() { b.rewarmLoop(ctx) })
	wg.Go(func() { b.live.gaugeLoop(ctx) })
	wg.Go(func() { b.outbox.run(ctx) })
	if b.webhook != nil {
		wg.Go(func() { b.webhook.run(ctx) })
	}
	if leaderSweepEvery > 0 {
		wg.Go(func() { b.life.runSweeper(ctx, leaderSweepEvery) })
	}
	if retireEvery > 0 {
		wg.Go(func() { b.retain.retireLoop(ctx) })
	}
	wg.Wait()
}
