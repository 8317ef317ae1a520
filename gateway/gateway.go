// Package gateway is flashgate's edge: a fasthttp server that turns a flood of
// purchase requests into admitted orders (DESIGN.md §1, steps 1-6). It validates
// without I/O, admits with one Lua call on the sale's Redis shard, publishes the
// admitted order to JetStream and answers 202 only once JetStream has it.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/reuseport"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics"
	"github.com/flashgate/flashgate/orderid"
	"github.com/flashgate/flashgate/ratelimit"
)

// Gateway is one running gateway process.
type Gateway struct {
	cfg      config.Config
	rc       rueidis.Client
	nc       *nats.Conn
	js       jetstream.JetStream
	scripts  *lua.Scripts
	auth     *auth.Cache
	lease    atomic.Pointer[orderid.Lease]
	sales    *sales
	events   *nats.Subscription
	limits   *ratelimit.Limits
	proxies  proxies
	breakers *breakers
	metrics  *metrics.Gateway
	releases *releases

	srv     *fasthttp.Server
	admin   *http.Server
	ln      net.Listener
	edge    *edgeListener
	adminLn net.Listener

	// crashAfter is a failpoint for fault tests, armed only in a binary built
	// with -tags failpoints (failpoints.go): the process dies between the N-th
	// admission and its publish, as a kill -9 there would.
	crashAfter atomic.Int64

	stop     context.CancelFunc
	bg       sync.WaitGroup
	shutdown sync.Once
	err      error
	now      func() time.Time
}

// Start connects to Redis and NATS, leases an order-id node, loads the sales,
// and serves the public and admin ports. It returns once it serves.
func Start(ctx context.Context, cfg config.Config) (_ *Gateway, err error) {
	g := &Gateway{cfg: cfg, scripts: lua.Load(), sales: newSales(cfg.Sales.LiveGrace), now: time.Now, metrics: metrics.NewGateway(),
		releases: newReleases(cfg.Gateway.ReleaseQueue)}
	defer func() {
		if err != nil {
			g.closeClients(context.Background())
		}
	}()
	v, err := auth.NewVerifier(cfg.Auth)
	if err != nil {
		return nil, err
	}
	g.auth = auth.NewCache(v, cfg.Gateway.TokenCacheSize)
	if g.proxies, err = parseProxies(cfg.Gateway.TrustedProxies); err != nil {
		return nil, fmt.Errorf("gateway: trusted_proxies: %w", err)
	}
	g.limits = ratelimit.New(cfg.RateLimit, cfg.Gateway.LimiterMaxKeys, cfg.Source)
	g.armFailpoints()
	g.breakers = newBreakers(cfg.Gateway.BreakerFailures, cfg.Gateway.BreakerOpen, g.metrics)
	g.rc, err = rueidis.NewClient(rueidis.ClientOption{
		InitAddress:  cfg.Redis.Addrs,
		Username:     cfg.Redis.Username,
		Password:     cfg.Redis.Password,
		DisableCache: true,
		// Only a dead-server detector: rueidis closes a pipelined connection
		// whose replies take longer, failing everything on it. Each request has
		// its own, shorter deadline (AdmitTimeout).
		ConnWriteTimeout: 3 * time.Second,
		Dialer:           net.Dialer{Timeout: time.Second},
		MaxFlushDelay:    cfg.Redis.MaxFlushDelay,
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: redis %v: %w", cfg.Redis.Addrs, err)
	}
	if g.nc, err = bus.Connect(cfg.NATS, "flashgate-gateway"); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if g.js, err = jetstream.New(g.nc); err != nil {
		return nil, fmt.Errorf("gateway: jetstream: %w", err)
	}
	if err = awaitStream(ctx, g.js, cfg.NATS); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	lease, err := orderid.Acquire(ctx, g.rc, cfg.Gateway.NodeLeaseTTL)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g.lease.Store(lease)
	// Subscribe before loading, so no change falls between the two.
	if g.events, err = bus.SubscribeEvents(g.nc, cfg.NATS, g.onEvent); err != nil {
		return nil, fmt.Errorf("gateway: events: %w", err)
	}
	if err = g.sales.load(ctx, g.rc); err != nil {
		return nil, fmt.Errorf("gateway: load sales: %w", err)
	}
	g.breakers.refreshSlots(ctx, g.rc)

	conns := connCap(cfg.Gateway.MaxConns, cfg.Gateway.Concurrency, raiseFDLimit())
	g.srv = &fasthttp.Server{
		Handler:               g.serve,
		HeaderReceived:        headerReceived,
		ErrorHandler:          g.handleError,
		Name:                  "flashgate",
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		ReadTimeout:           cfg.Gateway.ReadTimeout,
		WriteTimeout:          cfg.Gateway.WriteTimeout,
		IdleTimeout:           cfg.Gateway.IdleTimeout,
		MaxRequestBodySize:    cfg.Gateway.MaxBodyBytes,
		ReadBufferSize:        cfg.Gateway.MaxHeaderBytes,
		// The edge listener caps connections (gateway.max_conns, at most
		// concurrency) and refuses the excess in JSON; fasthttp's own cap,
		// answered in plain text, is set past it so it never fires (a
		// worker is released a moment after its connection closes).
		Concurrency: 2*conns + 1024,
		// Errors name their cause without quoting the client's bytes in logs.
		SecureErrorLogMessage: true,
		// An idle keep-alive connection gives its read and write buffers back
		// to the pool: 10,000 open connections held 180 MiB without it, 64
		// MiB with it (issue 6: ≤ 150 MB), for a pool get and put per request.
		ReduceMemoryUsage: true,
		CloseOnShutdown:   true,
		Logger:            quietLogger{},
	}
	var ln net.Listener
	if cfg.Gateway.ReusePort {
		ln, err = reuseport.Listen("tcp4", cfg.Gateway.Listen)
	} else {
		ln, err = net.Listen("tcp", cfg.Gateway.Listen)
	}
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g.edge = newEdgeListener(ln, edgeOptions{
		maxConns: conns, perIP: cfg.Gateway.MaxConnsPerIP, proxies: g.proxies,
		firstByte: cfg.Gateway.ReadTimeout, lingerTime: cfg.Gateway.LingerTimeout,
		lingerBytes: int64(cfg.Gateway.LingerMaxBytes), reg: g.metrics.Registry(),
		onRefuse: func() { g.metrics.Refused(metrics.LimitConns) },
	})
	g.ln = g.edge
	slog.Info("gateway: public port limits", "max_conns", conns, "max_conns_per_ip", cfg.Gateway.MaxConnsPerIP)
	if g.adminLn, err = net.Listen("tcp", cfg.Gateway.AdminListen); err != nil {
		g.ln.Close()
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g.admin = &http.Server{Handler: g.adminMux(), ReadHeaderTimeout: 5 * time.Second}

	bgctx, stop := context.WithCancel(context.Background())
	g.stop = stop
	g.goBG(func() {
		if err := g.srv.Serve(g.ln); err != nil {
			slog.Error("gateway: serve", "err", err)
		}
	})
	g.goBG(func() {
		if err := g.admin.Serve(g.adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("gateway: admin serve", "err", err)
		}
	})
	for range cfg.Gateway.ReleaseWorkers {
		g.goBG(func() { g.releaseWorker(bgctx) })
	}
	g.goBG(func() { g.refreshLoop(bgctx) })
	g.goBG(func() { g.leaseLoop(bgctx) })
	g.goBG(func() { g.watchConfig(bgctx) })
	slog.Info("gateway serving", "addr", g.Addr(), "admin", g.AdminAddr(), "node", lease.Node(), "sales", len(g.sales.list()))
	return g, nil
}

func (g *Gateway) goBG(f func()) {
	g.bg.Add(1)
	go func() { defer g.bg.Done(); f() }()
}

// Addr is the public listener's address.
func (g *Gateway) Addr() string { return g.ln.Addr().String() }

// AdminAddr is the admin listener's address.
func (g *Gateway) AdminAddr() string { return g.adminLn.Addr().String() }

// Run serves until ctx ends, then shuts down gracefully.
func Run(ctx context.Context, cfg config.Config) error {
	g, err := Start(ctx, cfg)
	if err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Gateway.ShutdownTimeout)
	defer cancel()
	return g.Shutdown(sctx)
}

// Shutdown stops accepting, lets in-flight requests finish (each has its own
// Redis and publish timeouts), then closes the clients. Idempotent.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.shutdown.Do(func() {
		slog.Info("gateway shutting down: draining in-flight requests")
		err := g.srv.ShutdownWithContext(ctx)
		g.edge.lingering.Wait() // bounded: each lingers at most 500 ms
		err = errors.Join(err, g.admin.Shutdown(ctx))
		g.stop()
		g.bg.Wait()
		g.closeClients(ctx)
		g.err = err
	})
	return g.err
}

func (g *Gateway) closeClients(ctx context.Context) {
	if g.events != nil {
		_ = g.events.Unsubscribe()
	}
	if l := g.lease.Load(); l != nil {
		_ = l.Close(ctx)
	}
	if g.nc != nil {
		_ = g.nc.Drain()
	}
	if g.rc != nil {
		g.rc.Close()
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
			nl, err := orderid.Acquire(c, g.rc, g.cfg.Gateway.NodeLeaseTTL)
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
	case bus.EventRetired:
		g.sales.retire(ev.SaleID, g.now())
	case bus.EventSoldOut, bus.EventRestocked:
		if s := g.sales.get([]byte(ev.SaleID)); s != nil {
			if f := s.soldOutFlag(ev.Region); f != nil {
				f.Store(ev.Type == bus.EventSoldOut)
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

func (g *Gateway) adminMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		var errs []error
		if err := g.rc.Do(ctx, g.rc.B().Ping().Build()).Error(); err != nil {
			errs = append(errs, fmt.Errorf("redis: %w", err))
		}
		if !g.nc.IsConnected() {
			errs = append(errs, errors.New("nats: not connected"))
		}
		if !g.lease.Load().Valid() {
			errs = append(errs, errors.New("order-id node lease lost"))
		}
		if why := g.edge.notAccepting(); why != "" {
			errs = append(errs, errors.New(why))
		}
		if err := errors.Join(errs...); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	// The probes and /metrics stay open (orchestrators and Prometheus scrape
	// them; they reveal counts, not orders). The admin API and pprof need the
	// admin token: profiles expose internals (heap contents, stacks, the
	// command line) and a CPU profile or trace costs the process while it
	// runs, even on a loopback port anything on the host can reach.
	mux.Handle("GET /metrics", g.metrics.Handler())
	mux.Handle("GET /admin/v1/limits", auth.RequireAdmin(g.cfg.Admin.Token, http.HandlerFunc(g.serveLimits)))
	mux.Handle("/admin/", auth.RequireAdmin(g.cfg.Admin.Token, http.NotFoundHandler()))
	mux.Handle("/debug/pprof/", auth.RequireAdmin(g.cfg.Admin.Token, metrics.PprofHandler()))
	return mux
}

// quietLogger sends fasthttp's own messages (mostly clients that hung up) to
// slog at debug level.
type quietLogger struct{}

func (quietLogger) Printf(format string, args ...any) { slog.Debug(fmt.Sprintf(format, args...)) }

// handleError answers what fasthttp refuses before the handler runs. Each
// answer closes the connection; those to a client that may still be sending
// linger, so it reads the answer instead of a reset.
func (g *Gateway) handleError(ctx *fasthttp.RequestCtx, err error) {
	ctx.SetConnectionClose()
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		// A slow client (slowloris): no linger, it has had its time.
		fail(ctx, fasthttp.StatusRequestTimeout, flashgate.CodeInvalidRequest,
			fmt.Sprintf("request not received within %s", g.cfg.Gateway.ReadTimeout))
		return
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		fail(ctx, fasthttp.StatusRequestEntityTooLarge, flashgate.CodeBodyTooLarge,
			fmt.Sprintf("body over %d bytes", g.cfg.Gateway.MaxBodyBytes))
	case errors.As(err, &small) || errors.Is(err, fasthttp.ErrSmallReadBuffer):
		fail(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, flashgate.CodeInvalidRequest,
			fmt.Sprintf("request line and headers over %d bytes", g.cfg.Gateway.MaxHeaderBytes))
	case errors.Is(err, fasthttp.ErrUnsupportedTransferEncoding):
		fail(ctx, fasthttp.StatusNotImplemented, flashgate.CodeInvalidRequest, "the only transfer coding served is chunked")
	case strings.Contains(err.Error(), "unsupported HTTP version"):
		// fasthttp has no error value for it.
		fail(ctx, fasthttp.StatusHTTPVersionNotSupported, flashgate.CodeInvalidRequest, "only HTTP/1.1 and HTTP/1.0 are served")
	default:
		fail(ctx, fasthttp.StatusBadRequest, flashgate.CodeInvalidRequest, "malformed HTTP request")
	}
	lingerOnClose(ctx)
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
