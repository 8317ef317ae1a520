// Package backend owns MySQL, the source of truth, and the processes that feed it:
// the consumers that turn admitted orders from JetStream into rows under the row
// guard of docs/design.md §8 and write each outcome back to Redis, the warming of Redis
// from MySQL, and the admin API of docs/design.md §4. Any number of backends share one
// durable consumer; the sale row lock serialises their batches of one sale.
package backend

import (
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

	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics"
	"github.com/flashgate/flashgate/mysql"
)

// Backend is one running backend process.
type Backend struct {
	cfg     config.Config
	log     *slog.Logger
	db      *sql.DB
	rc      rueidis.Client
	nc      *nats.Conn
	cons    jetstream.Consumer
	scripts *lua.Scripts
	writer  *orderWriter
	warmer  *warmer
	sub     *nats.Subscription
	life    *lifecycle     // pay, cancel, expiry (lifecycle.go)
	cmds    *commandServer // the queue group life serves
	// js publishes dead letters and republished orders; ops counts them;
	// leader runs the leader-elected work (deadletter.go, reconcile.go, leader.go).
	js      jetstream.JetStream
	ops     *opsMetrics
	leader  *leadership
	ingest  *ingest // the consumer loop, the writer, dead letters (consumer.go)
	events  *saleEvents
	admin   *adminAPI
	srv     *http.Server
	addr    string
	metrics *metrics.Backend

	// retain is the leader's retention pass (retention.go).
	retain *retainer
	// rec reconciles sales, for the leader and the admin API (reconcile.go).
	rec *reconciler

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

// Start connects to MySQL (and checks its schema version, migrating it when
// mysql.auto_migrate is on), Redis and NATS, ensures the stream
// and the durable consumer, warms every open sale Redis does not know, and starts
// the consumer loop and the admin server. It returns when the backend is ready.
func Start(ctx context.Context, cfg config.Config) (*Backend, error) {
	b := &Backend{cfg: cfg, log: slog.Default().With("component", "backend"), scripts: lua.Load(), metrics: metrics.NewBackend()}
	b.procCtx, b.procCancel = context.WithCancel(context.Background())
	started := false
	defer func() {
		if !started {
			if b.sub != nil {
				_ = b.sub.Unsubscribe()
			}
			_ = b.cmds.stop(context.Background())
			b.stopLeading()
			if b.warmer != nil {
				b.warmer.stop(context.Background())
			}
			b.procCancel()
			b.closeClients()
		}
	}()

	var err error
	if b.db, err = mysql.OpenDB(cfg.MySQL.DSN); err != nil {
		return nil, err
	}
	if cfg.MySQL.MaxOpenConns > 0 {
		b.db.SetMaxOpenConns(cfg.MySQL.MaxOpenConns)
		b.db.SetMaxIdleConns(cfg.MySQL.MaxOpenConns)
	}
	// Recycle connections well inside any server or proxy idle timeout.
	b.db.SetConnMaxLifetime(30 * time.Minute)
	if err := b.db.PingContext(ctx); err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	if err := checkSchema(ctx, b.db, cfg.MySQL.AutoMigrate); err != nil {
		return nil, err
	}

	if b.rc, err = rueidis.NewClient(rueidis.ClientOption{InitAddress: cfg.Redis.Addrs, Username: cfg.Redis.Username, Password: cfg.Redis.Password, DisableCache: true}); err != nil {
		return nil, fmt.Errorf("redis %v: %w", cfg.Redis.Addrs, err)
	}

	if b.nc, err = bus.Connect(cfg.NATS, "flashgate-backend"); err != nil {
		return nil, err
	}
	js, err := jetstream.New(b.nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if _, err := bus.EnsureStream(ctx, js, cfg.NATS); err != nil {
		return nil, err
	}
	if b.cons, err = js.CreateOrUpdateConsumer(ctx, cfg.NATS.Stream, consumerConfig(cfg)); err != nil {
		return nil, fmt.Errorf("consumer %s: %w", cfg.NATS.Consumer, err)
	}

	b.writer = newOrderWriter(b.db, b.rc, b.scripts, b.log, b.metrics)
	// Units MySQL refused go back on sale: gateways clear their sold-out marks.
	b.writer.restocked = func(sale, region string) {
		ev := bus.SaleEvent{Type: bus.EventRestocked, SaleID: sale, Region: region}
		if err := bus.PublishEvent(b.nc, cfg.NATS, ev); err != nil {
			b.log.Warn("restocked event", "sale", sale, "err", err) // gateways' refresh heals it
		}
	}
	b.warmer = newWarmer(b.db, b.rc, b.scripts, b.log)
	b.events = &saleEvents{nc: b.nc, cfg: cfg.NATS, log: b.log}
	b.life = &lifecycle{db: b.db, rc: b.rc, nc: b.nc, nats: cfg.NATS, scripts: b.scripts, log: b.log, events: b.events, procCtx: b.procCtx}
	if err := b.prepareOps(ctx, js); err != nil {
		return nil, err
	}
	b.ingest = &ingest{
		cfg: ingestConfig{NATS: cfg.NATS, Backend: cfg.Backend}, log: b.log, db: b.db, rc: b.rc, nc: b.nc, js: js,
		cons: b.cons, scripts: b.scripts, writer: b.writer, metrics: b.metrics, ops: b.ops, procCtx: b.procCtx,
	}
	if err := b.startLeading(); err != nil {
		return nil, err
	}
	b.warmOpenSales(ctx)
	if b.sub, err = bus.SubscribeEvents(b.nc, cfg.NATS, b.onEvent); err != nil {
		return nil, fmt.Errorf("sale events: %w", err)
	}
	if b.cmds, err = b.life.serveCommands(); err != nil {
		return nil, err
	}

	if cfg.Admin.Token == "" {
		b.log.Warn("admin.token is empty: the admin API refuses every request (set FLASHGATE_ADMIN_TOKEN)")
	}
	b.admin = &adminAPI{
		token: cfg.Admin.Token, log: b.log, db: b.db, rc: b.rc, nc: b.nc, metrics: b.metrics,
		warmer: b.warmer, events: b.events, reconcile: b.rec.ReconcileWith, isLeader: b.IsLeader,
	}
	ln, err := net.Listen("tcp", cfg.Backend.AdminListen)
	if err != nil {
		return nil, fmt.Errorf("admin listen: %w", err)
	}
	b.addr = ln.Addr().String()
	b.srv = &http.Server{
		Handler:           b.admin.handler(),
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

	fetchCtx, stop := context.WithCancel(context.Background())
	b.stopFetch, b.loopDone = stop, make(chan struct{})
	go b.ingest.consume(fetchCtx, b.loopDone)
	lagCtx, stopLag := context.WithCancel(context.Background())
	b.stopLag = stopLag
	b.wg.Go(func() { b.ingest.pollLag(lagCtx) })

	started = true
	b.log.Info("backend ready", "admin", b.addr, "stream", cfg.NATS.Stream, "consumer", cfg.NATS.Consumer)
	return b, nil
}

// AdminAddr is the host:port the admin API listens on.
func (b *Backend) AdminAddr() string { return b.addr }

// Shutdown stops fetching, finishes the batch in hand (acking what was
// committed), stops the admin server and the warms, and closes the clients. When
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
	b.stopLeading()
	if err := b.cmds.stop(ctx); err != nil {
		errs = append(errs, err)
	}
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
	b.closeClients()
	b.log.Info("backend stopped")
	return errors.Join(errs...)
}

// closeClients closes whatever Start opened. Acks are fire-and-forget
// publishes: flush them before the connection goes.
func (b *Backend) closeClients() {
	if b.nc != nil {
		_ = b.nc.FlushTimeout(2 * time.Second)
		b.nc.Close()
	}
	if b.rc != nil {
		b.rc.Close()
	}
	if b.db != nil {
		b.db.Close()
	}
}

// Run starts a backend, serves until ctx ends, then shuts down within
// cfg.Backend.ShutdownTimeout.
func Run(ctx context.Context, cfg config.Config) error {
	b, err := Start(ctx, cfg)
	if err != nil {
		return err
	}
	<-ctx.Done()
	timeout := cfg.Backend.ShutdownTimeout
	if timeout <= 0 {
		timeout = config.Default().Backend.ShutdownTimeout
	}
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return b.Shutdown(sctx)
}

// checkSchema refuses a schema this binary cannot run on. A backend applies
// pending migrations itself only when told to (auto): otherwise an old schema
// stops it with the command that fixes it. A half-applied or newer schema is
// refused either way.
func checkSchema(ctx context.Context, db *sql.DB, auto bool) error {
	if auto {
		return mysql.Migrate(ctx, db)
	}
	return mysql.CheckSchema(ctx, db)
}
