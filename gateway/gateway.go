// Package gateway is flashgate's edge: a fasthttp server that turns a flood of
// purchase requests into admitted orders. It validates without I/O, admits with
// one Lua call on the sale's Redis shard, publishes the admitted order to
// JetStream and answers 202 only once JetStream has it (docs/gateway.md walks
// the purchase path step by step, in purchase.go).
//
// The gateway is handed clients that are already dialed (Deps) and its slice
// of the configuration (config.GatewayOptions); it never dials a server, and
// closing the clients is left to whoever dialed them, after Shutdown.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"
	"github.com/valyala/fasthttp"

	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics"
	"github.com/flashgate/flashgate/orderid"
	"github.com/flashgate/flashgate/ratelimit"
)

// Deps are the dialed clients a gateway works with. The gateway does not
// close them: its Shutdown stops using them, then their owner closes them.
type Deps struct {
	Redis     rueidis.Client
	NATS      *nats.Conn
	JetStream jetstream.JetStream
	// Now is the gateway's clock (nil: time.Now); a test sets a skewed one.
	Now func() time.Time
}

// settings are the configuration values a running gateway reads; the rest of
// config.GatewayOptions (auth, rate limits, cache grace) is used once, at start.
type settings struct {
	Gateway        config.Gateway
	NATS           config.NATS
	PaymentTimeout time.Duration
	WaitReplicas   int
	WaitTimeout    time.Duration
	AdminToken     string
	AdminHosts     []string
	File           string
}

// Gateway is one running gateway process.
type Gateway struct {
	cfg     settings
	rc      rueidis.Client
	nc      *nats.Conn
	js      jetstream.JetStream
	scripts *lua.Scripts
	auth    *auth.Cache
	// deny follows Redis's denylist into auth's (denylist.go).
	deny denylist
	// payments verifies the payment service's signatures (POST /v1/payments).
	payments *auth.PaymentVerifier
	lease    atomic.Pointer[orderid.Lease]
	sales    *sales
	events   *nats.Subscription
	limits   *ratelimit.Limits
	proxies  proxies
	breakers *breakers
	metrics  *metrics.Gateway
	releases *releases
	// marks are the sold-out files an nginx beside the gateway answers
	// from (edgemarks.go); nil when gateway.edge_marks_dir is "".
	marks *edgeMarks
	// id names this gateway in its stats (stats.go); accessSample is
	// gateway.access_log_sample.
	id           string
	accessSample float64

	srv     *fasthttp.Server
	edge    *edgeListener
	admin   *http.Server
	adminLn net.Listener

	// crashAfter is a failpoint for fault tests, armed only in a binary built
	// with -tags failpoints (failpoints.go): the process dies between the N-th
	// admission and its publish, as a kill -9 there would.
	crashAfter atomic.Int64

	// hints are the sales a sold-out hint asks to read (hints.go).
	hints chan *sale

	stop     context.CancelFunc
	bg       sync.WaitGroup
	shutdown sync.Once
	err      error
	now      func() time.Time
	// skew is the gateway's clock less Redis's, in nanoseconds, as last
	// sampled (lua.WatchSkew): the local window checks read Redis's clock
	// through it (redisNow).
	skew atomic.Int64
}

// Start leases an order-id node, loads the sales, and serves the public and
// admin ports on the given clients. It returns once it serves. On an error it
// has given back what it took (lease, subscription, ports); the clients stay
// open, their owner's to close.
func Start(ctx context.Context, deps Deps, opts config.GatewayOptions) (_ *Gateway, err error) {
	g, err := newGateway(deps, opts)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			g.release(context.Background())
		}
	}()
	if err = g.connect(ctx); err != nil {
		return nil, err
	}
	if err = g.listen(); err != nil {
		return nil, err
	}
	g.runBackground()
	slog.Info("gateway serving", "addr", g.Addr(), "admin", g.AdminAddr(), "node", g.lease.Load().Node(), "sales", len(g.sales.list()))
	return g, nil
}

// newGateway builds the gateway's in-memory parts: nothing here does I/O.
func newGateway(deps Deps, opts config.GatewayOptions) (*Gateway, error) {
	if deps.Redis == nil || deps.NATS == nil || deps.JetStream == nil {
		return nil, errors.New("gateway: Redis, NATS and JetStream clients are required")
	}
	g := &Gateway{
		cfg: settings{Gateway: opts.Gateway, NATS: opts.NATS, PaymentTimeout: opts.PaymentTimeout,
			WaitReplicas: opts.WaitReplicas, WaitTimeout: opts.WaitTimeout, AdminToken: opts.AdminToken, AdminHosts: opts.AdminHosts, File: opts.File},
		rc: deps.Redis, nc: deps.NATS, js: deps.JetStream,
		scripts: lua.LoadWait(opts.WaitReplicas, opts.WaitTimeout), sales: newSales(opts.LiveGrace), now: deps.Now, metrics: metrics.NewGateway(),
		releases: newReleases(opts.Gateway.ReleaseQueue), marks: newEdgeMarks(opts.Gateway.EdgeMarksDir),
		id: newRequestID()[:16], accessSample: opts.Gateway.AccessLogSample,
		hints: make(chan *sale, hintQueue),
	}
	if g.now == nil {
		g.now = time.Now
	}
	v, err := auth.NewVerifier(opts.Auth)
	if err != nil {
		return nil, err
	}
	g.auth = auth.NewCache(v, opts.Gateway.TokenCacheSize)
	g.payments = auth.NewPaymentVerifier(opts.PaymentSecrets)
	if len(opts.PaymentSecrets) == 0 {
		slog.Warn("gateway: no payments secret (payments.secret, FLASHGATE_PAYMENTS_SECRET): every POST /v1/payments is refused")
	}
	if g.proxies, err = parseProxies(opts.Gateway.TrustedProxies); err != nil {
		return nil, fmt.Errorf("gateway: trusted_proxies: %w", err)
	}
	g.limits = ratelimit.New(opts.RateLimit, opts.Gateway.LimiterMaxKeys, opts.File)
	g.limits.Shadow(config.Shadowed("ratelimit"))
	g.armFailpoints()
	g.breakers = newBreakers(opts.Gateway.BreakerFailures, opts.Gateway.BreakerOpen, g.metrics)
	return g, nil
}

// connect takes what the gateway needs from the servers before it serves:
// the orders stream, an order-id node, the sale events and the sales.
func (g *Gateway) connect(ctx context.Context) error {
	if err := awaitStream(ctx, g.js, g.cfg.NATS); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	lease, err := g.acquireNode(ctx)
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	g.lease.Store(lease)
	// Subscribe before loading, so no change falls between the two.
	if g.events, err = bus.SubscribeEvents(g.nc, g.cfg.NATS, g.onEvent); err != nil {
		return fmt.Errorf("gateway: events: %w", err)
	}
	if err = g.sales.load(ctx, g.rc); err != nil {
		return fmt.Errorf("gateway: load sales: %w", err)
	}
	if err = g.deny.sync(ctx, g, g.now()); err != nil {
		return fmt.Errorf("gateway: denylist: %w", err)
	}
	if g.marks != nil {
		if err = g.marks.prepare(g.now()); err != nil {
			return fmt.Errorf("gateway: edge_marks_dir: %w", err)
		}
	}
	g.breakers.refreshSlots(ctx, g.rc)
	return nil
}

// runBackground serves both ports and starts the loops that keep the gateway
// current; Shutdown stops them all.
func (g *Gateway) runBackground() {
	bgctx, stop := context.WithCancel(context.Background())
	g.stop = stop
	g.goBG(func() {
		if err := g.srv.Serve(g.edge); err != nil {
			slog.Error("gateway: serve", "err", err)
		}
	})
	g.goBG(func() {
		if err := g.admin.Serve(g.adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("gateway: admin serve", "err", err)
		}
	})
	for range g.cfg.Gateway.ReleaseWorkers {
		g.goBG(func() { g.releaseWorker(bgctx) })
	}
	g.goBG(func() { g.refreshLoop(bgctx) })
	g.goBG(func() { g.leaseLoop(bgctx) })
	g.goBG(func() { g.watchConfig(bgctx) })
	g.goBG(func() { g.statsLoop(bgctx) })
	g.goBG(func() { g.denylistLoop(bgctx, &g.deny) })
	g.goBG(func() { g.hintWorker(bgctx) })
	g.goBG(func() {
		lua.WatchSkew(bgctx, g.rc, g.now, func(d time.Duration) {
			g.skew.Store(int64(d))
			g.metrics.SetRedisSkew(d)
		})
	})
	if g.marks != nil {
		g.goBG(func() { g.edgeMarkLoop(bgctx) })
	}
}

func (g *Gateway) goBG(f func()) {
	g.bg.Add(1)
	go func() { defer g.bg.Done(); f() }()
}

// Addr is the public listener's address.
func (g *Gateway) Addr() string { return g.edge.Addr().String() }

// AdminAddr is the admin listener's address.
func (g *Gateway) AdminAddr() string { return g.adminLn.Addr().String() }

// Shutdown stops accepting, lets in-flight requests finish (each has its own
// Redis and publish timeouts), stops the background loops and gives back the
// order-id node and the event subscription. The clients stay open: close them
// after Shutdown returns. Idempotent.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.shutdown.Do(func() {
		slog.Info("gateway shutting down: draining in-flight requests")
		err := g.srv.ShutdownWithContext(ctx)
		// fasthttp closes only the listeners its Serve has registered: a
		// Shutdown right after Start can come before Serve did, and Serve
		// would then accept forever. Closing the listener here ends it.
		_ = g.edge.Close()
		g.edge.lingering.Wait() // bounded: each lingers at most 500 ms
		err = errors.Join(err, g.admin.Shutdown(ctx))
		g.stop()
		g.bg.Wait()
		g.release(ctx)
		g.err = err
	})
	return g.err
}

// release gives back what the gateway holds on the servers: the event
// subscription and the order-id node (which another gateway may then lease).
func (g *Gateway) release(ctx context.Context) {
	if g.events != nil {
		_ = g.events.Unsubscribe()
	}
	if l := g.lease.Load(); l != nil {
		_ = l.Close(ctx)
	}
}

// refreshLoop keeps the sale cache warm: stock figures often, the full list
// less often (events carry changes at once; this heals a lost event).
func (g *Gateway) refreshLoop(ctx context.Context) {
	stock := time.NewTicker(500 * time.Millisecond)
	full := time.NewTicker(g.cfg.Gateway.SaleRefresh)
	defer stock.Stop()
	defer full.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-full.C:
			c, cancel := context.WithTimeout(ctx, 2*time.Second)
			if err := g.sales.load(c, g.rc); err != nil {
				slog.Warn("gateway: reload sales", "err", err)
			}
			g.breakers.refreshSlots(c, g.rc)
			cancel()
			g.limits.Sweep(time.Now())
		case now := <-stock.C:
			c, cancel := context.WithTimeout(ctx, time.Second)
			g.sales.refreshStock(c, g.rc, now)
			cancel()
			marks := 0
			for _, s := range g.sales.list() {
				marks += s.marks()
			}
			g.metrics.SoldOutMarks(marks)
		}
	}
}

// leaseLoop takes a new order-id node when the lease is lost. Until then
// purchases answer 503: two gateways on one node could make the same id.
func (g *Gateway) leaseLoop(ctx context.Context) {
	for {
		l := g.lease.Load()
		select {
		case <-ctx.Done():
			return
		case <-l.Lost():
		}
		for {
			c, cancel := context.WithTimeout(ctx, 2*time.Second)
			nl, err := g.acquireNode(c)
			cancel()
			if err == nil {
				_ = l.Close(ctx)
				g.lease.Store(nl)
				slog.Info("gateway: new order-id node", "node", nl.Node())
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}

func (g *Gateway) onEvent(ev bus.SaleEvent) {
	switch ev.Type {
	case bus.EventCreated:
		if ev.Sale != nil && ev.Sale.ID == ev.SaleID {
			g.sales.put(ev.Sale)
		}
	case bus.EventClosed:
		if s := g.sales.get([]byte(ev.SaleID)); s != nil {
			s.closed.Store(true)
			s.render(g.now())
		}
	case bus.EventPaused, bus.EventResumed:
		g.sales.setPaused(ev.SaleID, ev.Type == bus.EventPaused)
	case bus.EventRetired:
		g.sales.retire(ev.SaleID, g.now())
	case bus.EventStale, bus.EventFresh:
		g.onLaneEvent(ev)
	case bus.EventSoldOut:
		// Another gateway's word: Redis's decides (hints.go).
		if s := g.sales.get([]byte(ev.SaleID)); s != nil {
			g.onSoldOutHint(s)
		}
	case bus.EventRestocked:
		if s := g.sales.get([]byte(ev.SaleID)); s != nil {
			if f := s.soldOutFlag(ev.Region); f != nil {
				f.Store(false)
			}
			if g.marks != nil {
				g.marks.clear(s.spec.ID, g.now())
			}
		}
	}
}

// markSoldOut marks a sale (or region) sold out here and tells every gateway.
func (g *Gateway) markSoldOut(s *sale, region string) {
	if f := s.soldOutFlag(region); f != nil && !f.Swap(true) {
		g.metrics.SoldOutMarked()
		g.broadcast(s, bus.EventSoldOut, region)
	}
}

// restocked clears a sold-out mark after units went back, here and everywhere.
func (g *Gateway) restocked(s *sale, region string) {
	if f := s.soldOutFlag(region); f != nil {
		f.Store(false)
	}
	if g.marks != nil {
		g.marks.clear(s.spec.ID, g.now())
	}
	g.broadcast(s, bus.EventRestocked, region)
}

func (g *Gateway) broadcast(s *sale, typ, region string) {
	if err := bus.PublishHint(g.nc, g.cfg.NATS, bus.SaleEvent{Type: typ, SaleID: s.spec.ID, Region: region}); err != nil {
		// The refresh loop reads Redis every 500 ms and heals a lost event.
		slog.Warn("gateway: sale event", "type", typ, "sale", s.spec.ID, "err", err)
	}
}

// askWarm tells the backends that a sale is not warmed in Redis, at most once
// a second per sale per gateway.
func (g *Gateway) askWarm(s *sale) {
	now := g.now().UnixMilli()
	last := s.warmAsked.Load()
	if now-last < 1000 || !s.warmAsked.CompareAndSwap(last, now) {
		return
	}
	if err := bus.PublishHint(g.nc, g.cfg.NATS, bus.SaleEvent{Type: bus.EventWarm, SaleID: s.spec.ID}); err != nil {
		slog.Warn("gateway: ask warm", "sale", s.spec.ID, "err", err)
	}
}

// awaitStream checks that the orders stream exists. Backends create it: a
// gateway's NATS user may only look it up (and publish orders), so that a
// gateway cannot change the stream's retention or limits. A stream that does
// not exist yet is created if this gateway's user is allowed to (a test's
// or an operator's user), and is otherwise the backend's to create.
func awaitStream(ctx context.Context, js jetstream.JetStream, cfg config.NATS) error {
	_, err := js.Stream(ctx, cfg.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if _, cerr := bus.EnsureStream(ctx, js, cfg); cerr != nil {
			return fmt.Errorf("stream %s does not exist and this gateway cannot create it (start a backend first): %w", cfg.Stream, cerr)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("stream %s: %w", cfg.Stream, err)
	}
	return nil
}

// acquireNode leases an order-id node in gateway.node_ids (all when unset).
func (g *Gateway) acquireNode(ctx context.Context) (*orderid.Lease, error) {
	from, to, ok, err := g.cfg.Gateway.NodeRange()
	if err != nil {
		return nil, err
	}
	if !ok {
		return orderid.Acquire(ctx, g.rc, g.cfg.Gateway.NodeLeaseTTL)
	}
	return orderid.AcquireIn(ctx, g.rc, g.cfg.Gateway.NodeLeaseTTL, from, to)
}
