// Package backend owns MySQL, the source of truth, and the processes that feed it:
// the consumers that turn admitted orders from JetStream into rows under the row
// guard of docs/design.md §8 and write each outcome back to Redis, the warming of Redis
// from MySQL, and the admin API of docs/design.md §4. Any number of backends share one
// durable consumer; the sale row lock serialises their batches of one sale.
package backend

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"

	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics"
)

// Deps are the clients a backend works with, dialed by the caller
// (internal/dial, wired by internal/wire). The backend never closes them: the
// caller does, after Shutdown. DB has had its schema checked.
type Deps struct {
	DB        *sql.DB
	Redis     rueidis.Client
	NATS      *nats.Conn
	JetStream jetstream.JetStream
	// Locker is the leader lock's (LeaderLockerOption); Shutdown closes it,
	// which releases the lock at once.
	Locker rueidislock.Locker
}

// Backend is one running backend process: the owner of its parts. It builds
// them, starts them (the leader's work under the election), and stops them in
// order; each part holds only what it uses.
type Backend struct {
	opts    config.BackendOptions
	log     *slog.Logger
	db      *sql.DB
	rc      rueidis.Client
	nc      *nats.Conn
	js      jetstream.JetStream
	cons    jetstream.Consumer
	scripts *lua.Scripts
	metrics *metrics.Backend
	ops     *opsMetrics

	writer *orderWriter
	warmer *warmer
	events *saleEvents
	ingest *ingest     // the consumer loop, the writer, dead letters (consumer.go)
	life   *lifecycle  // pay, cancel, expiry (lifecycle.go)
	rec    *reconciler // for the leader and the admin API (reconcile.go)
	retain *retainer   // the leader's retention pass (retention.go)
	admin  *adminAPI
	live   *live // the per-sale gauges and the live view (live.go)
	stats  *nats.Subscription

	// The leader's order events (docs/events.md).
	outbox  *eventPublisher // the publisher of MySQL's outbox (outbox.go)
	webhook *webhook        // their webhook delivery, nil if none (webhook.go)

	sub  *nats.Subscription
	cmds *commandServer // the queue group life serves
	lane *lane          // the degraded lane's queue group (degrade.go)
	// stopLane ends the lane's order-id node keeper.
	stopLane context.CancelFunc
	leader   *leadership
	locker   rueidislock.Locker
	srv      *http.Server
	addr     string

	// stopFetch ends the consumer loop after the batch in hand; loopDone closes
	// when it has. procCtx carries that batch's work and is cancelled only when
	// Shutdown runs out of time.
	stopFetch  context.CancelFunc
	loopDone   chan struct{}
	procCtx    context.Context
	procCancel context.CancelFunc
	// stopLag ends the consumer lag poller.
	stopLag context.CancelFunc
	// wg owns the admin server's goroutine and the lag poller.
	wg sync.WaitGroup

	shutdownOnce sync.Once
	shutdownErr  error
}

// Start ensures the stream and the durable consumer on the clients it is
// given, warms every open sale Redis does not know, and starts the consumer
// loop, the order commands, the election and the admin server. It returns
// when the backend is ready. When it fails, what it started is stopped; the
// clients stay the caller's to close.
func Start(ctx context.Context, deps Deps, opts config.BackendOptions) (*Backend, error) {
	b := &Backend{
		opts: opts, log: slog.Default().With("component", "backend"), scripts: lua.LoadWait(opts.WaitReplicas, opts.WaitTimeout), metrics: metrics.NewBackend(),
		db: deps.DB, rc: deps.Redis, nc: deps.NATS, js: deps.JetStream, locker: deps.Locker,
	}
	b.procCtx, b.procCancel = context.WithCancel(context.Background())
	started := false
	defer func() {
		if !started {
			b.abandon()
		}
	}()
	if err := b.build(ctx); err != nil {
		return nil, err
	}
	if err := b.startLeading(); err != nil {
		return nil, err
	}
	b.warmOpenSales(ctx)
	b.warmer.begin()
	b.live.known = b.warmer.isKnown
	var err error
	if b.sub, err = bus.SubscribeEvents(b.nc, opts.NATS, b.onEvent); err != nil {
		return nil, fmt.Errorf("sale events: %w", err)
	}
	if b.stats, err = bus.SubscribeStats(b.nc, opts.NATS, b.live.onStats); err != nil {
		return nil, fmt.Errorf("gateway stats: %w", err)
	}
	if b.cmds, err = b.life.serveCommands(); err != nil {
		return nil, err
	}
	if err := b.serveLane(); err != nil {
		return nil, err
	}
	if err := b.serveAdmin(); err != nil {
		return nil, err
	}
	b.startConsuming()
	started = true
	b.log.Info("backend ready", "admin", b.addr, "stream", opts.NATS.Stream, "consumer", opts.NATS.Consumer)
	return b, nil
}

// build ensures the stream and the consumer and builds the parts, each on
// the clients and options it uses.
func (b *Backend) build(ctx context.Context) error {
	opts := b.opts
	// The gateways call flashgate's functions and may not load them: the
	// backend does (docs/credentials.md), now and whenever Redis lost them
	// (startConsuming). A Redis away now is retried there.
	if err := lua.EnsureLibrary(ctx, b.rc); err != nil {
		b.log.Warn("redis function library not loaded; retrying", "err", err)
	}
	if _, err := bus.EnsureStream(ctx, b.js, opts.NATS); err != nil {
		return err
	}
	var err error
	if b.cons, err = b.js.CreateOrUpdateConsumer(ctx, opts.NATS.Stream, consumerConfig(opts)); err != nil {
		return fmt.Errorf("consumer %s: %w", opts.NATS.Consumer, err)
	}
	b.writer = newOrderWriter(b.db, b.rc, b.scripts, b.log, b.metrics)
	b.writer.trust = b.writer.trust.with(opts.Backend.ClockSkew, opts.PublishTimeout, opts.PaymentTimeout)
	// Units MySQL refused go back on sale: gateways clear their sold-out marks.
	b.writer.restocked = func(sale, region string) {
		ev := bus.SaleEvent{Type: bus.EventRestocked, SaleID: sale, Region: region}
		if err := bus.PublishEvent(b.nc, opts.NATS, ev); err != nil {
			b.log.Warn("restocked event", "sale", sale, "err", err) // gateways' refresh heals it
		}
	}
	b.warmer = newWarmer(b.db, b.rc, b.scripts, b.log)
	if opts.Retention > 0 {
		b.warmer.retention = opts.Retention
	}
	b.events = &saleEvents{nc: b.nc, cfg: opts.NATS, log: b.log}
	b.life = &lifecycle{db: b.db, rc: b.rc, nc: b.nc, nats: opts.NATS, scripts: b.scripts, log: b.log, events: b.events, procCtx: b.procCtx, metrics: b.metrics}
	if err := b.prepareOps(ctx, b.js); err != nil {
		return err
	}
	b.ingest = &ingest{
		cfg: ingestConfig{NATS: opts.NATS, Backend: opts.Backend}, log: b.log, db: b.db, rc: b.rc, nc: b.nc, js: b.js,
		cons: b.cons, scripts: b.scripts, writer: b.writer, metrics: b.metrics, ops: b.ops, procCtx: b.procCtx,
	}
	b.ingest.room = newWaitRoom(b.ingest)
	b.admin = &adminAPI{
		keys: auth.NewAdminKeys(opts.AdminKeys), natsCfg: opts.NATS, js: b.js, log: b.log, db: b.db, rc: b.rc, nc: b.nc, metrics: b.metrics,
		waitReplicas: opts.WaitReplicas, waitTimeout: opts.WaitTimeout, maxTokenTTL: cmp.Or(opts.MaxTokenTTL, auth.DefaultMaxTTL),
		warmer: b.warmer, events: b.events, reconcile: b.rec.ReconcileWith, isLeader: b.IsLeader, cancel: b.life.cancel, live: b.live,
		liveSnaps: &liveSnapshots{live: b.live},
	}
	return nil
}

// serveAdmin listens on backend.admin_listen and serves the admin API.
func (b *Backend) serveAdmin() error {
	if len(b.opts.AdminKeys) == 0 {
		b.log.Warn("no admin key (admin.token, admin.keys): the admin API refuses every request (set FLASHGATE_ADMIN_TOKEN)")
	}
	ln, err := net.Listen("tcp", b.opts.Backend.AdminListen)
	if err != nil {
		return fmt.Errorf("admin listen: %w", err)
	}
	b.addr = ln.Addr().String()
	b.srv = &http.Server{
		Handler:           auth.AdminPort(b.admin.handler(), b.addr, b.opts.AllowedHosts),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(b.log.Handler(), slog.LevelWarn),
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		if err := b.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			b.log.Error("admin server stopped", "err", err)
		}
	}()
	return nil
}

// libraryEvery is how often the backend checks that every Redis master has
// the function library: the longest the gateways answer 503 after a Redis
// lost it while no backend call needed a function there.
const libraryEvery = time.Second

// startConsuming starts the consumer loop and its lag poller.
func (b *Backend) startConsuming() {
	fetchCtx, stop := context.WithCancel(context.Background())
	b.stopFetch, b.loopDone = stop, make(chan struct{})
	go b.ingest.consume(fetchCtx, b.loopDone)
	lagCtx, stopLag := context.WithCancel(context.Background())
	b.stopLag = stopLag
	b.wg.Go(func() { b.ingest.pollLag(lagCtx) })
	// This process's clock against Redis's, for the gauge and its alert
	// (no decision of the backend reads its own clock against another's).
	b.wg.Go(func() { lua.WatchSkew(lagCtx, b.rc, time.Now, b.metrics.SetRedisSkew) })
	b.wg.Go(func() {
		lua.KeepLibrary(lagCtx, b.rc, libraryEvery, func(err error) {
			b.log.Warn("redis function library check failed", "err", err)
		})
	})
}

// abandon stops what a failed Start had started.
func (b *Backend) abandon() {
	if b.sub != nil {
		_ = b.sub.Unsubscribe()
	}
	if b.stats != nil {
		_ = b.stats.Unsubscribe()
	}
	_ = b.cmds.stop(context.Background())
	b.stopLaneServing()
	if b.leader == nil && b.locker != nil {
		b.locker.Close() // handed over with Deps: the backend closes it
	}
	b.stopLeading()
	if b.srv != nil {
		_ = b.srv.Close()
		b.wg.Wait()
	}
	if b.warmer != nil {
		b.warmer.stop(context.Background())
	}
	if b.ingest != nil && b.loopDone == nil {
		b.ingest.room.close() // the consumer loop, which closes it, never ran
	}
	b.procCancel()
}

// AdminAddr is the host:port the admin API listens on.
func (b *Backend) AdminAddr() string { return b.addr }

// Shutdown stops fetching, finishes the batch in hand (acking what was
// committed), releases the leadership, stops the admin server and the warms.
// The clients stay open (acks are flushed when the caller closes them). When
// ctx ends first, the batch in hand is abandoned: its messages are redelivered.
// It is idempotent.
func (b *Backend) Shutdown(ctx context.Context) error {
	b.shutdownOnce.Do(func() { b.shutdownErr = b.shutdown(ctx) })
	return b.shutdownErr
}

func (b *Backend) shutdown(ctx context.Context) error {
	var errs []error
	if b.sub != nil {
		if err := b.sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			errs = append(errs, fmt.Errorf("unsubscribe events: %w", err))
		}
	}
	if b.stats != nil {
		_ = b.stats.Unsubscribe()
	}
	b.stopLeading()
	if err := b.cmds.stop(ctx); err != nil {
		errs = append(errs, err)
	}
	b.stopLaneServing()
	b.stopFetch()
	b.stopLag()
	select {
	case <-b.loopDone:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("shutdown: batch in hand abandoned: %w", ctx.Err()))
		b.procCancel()
		<-b.loopDone
	}
	if err := b.srv.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("admin server: %w", err))
		b.srv.Close()
	}
	b.wg.Wait()
	b.warmer.stop(ctx)
	b.procCancel()
	b.log.Info("backend stopped")
	return errors.Join(errs...)
}
