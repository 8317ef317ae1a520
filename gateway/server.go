package gateway

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/reuseport"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/metrics"
)

// listen opens the public port (behind the edge listener's connection caps)
// and the admin port, and builds their servers. Nothing is served yet.
func (g *Gateway) listen() error {
	c := g.cfg.Gateway
	conns := connCap(c.MaxConns, c.Concurrency, raiseFDLimit())
	ln, err := listenPublic(c.Listen, c.ReusePort)
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	g.edge = newEdgeListener(ln, edgeOptions{
		maxConns: conns, perIP: c.MaxConnsPerIP, proxies: g.proxies,
		firstByte: c.ReadTimeout, lingerTime: c.LingerTimeout,
		lingerBytes: int64(c.LingerMaxBytes), reg: g.metrics.Registry(),
		onRefuse: func() { g.metrics.Refused(metrics.LimitConns) },
	})
	slog.Info("gateway: public port limits", "max_conns", conns, "max_conns_per_ip", c.MaxConnsPerIP)
	if g.adminLn, err = net.Listen("tcp", c.AdminListen); err != nil {
		g.edge.Close()
		return fmt.Errorf("gateway: %w", err)
	}
	g.srv = g.publicServer(conns)
	// The admin port's connections have deadlines too: without them one
	// client holding connections open idle (or trickling a request) keeps
	// goroutines and descriptors of the process that serves buyers.
	g.admin = &http.Server{
		Handler:           auth.AdminPort(g.adminMux(), g.adminLn.Addr().String(), g.cfg.AdminHosts),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second, // pprof adds its ?seconds= to it
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
	}
	return nil
}

func listenPublic(addr string, reusePort bool) (net.Listener, error) {
	if reusePort {
		return reuseport.Listen("tcp4", addr)
	}
	return net.Listen("tcp", addr)
}

// publicServer is the fasthttp server of the public port; conns is the edge
// listener's connection cap.
func (g *Gateway) publicServer(conns int) *fasthttp.Server {
	c := g.cfg.Gateway
	return &fasthttp.Server{
		Handler:               g.serve,
		HeaderReceived:        headerReceived,
		ErrorHandler:          g.handleError,
		Name:                  "flashgate",
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		ReadTimeout:           c.ReadTimeout,
		WriteTimeout:          c.WriteTimeout,
		IdleTimeout:           c.IdleTimeout,
		MaxRequestBodySize:    c.MaxBodyBytes,
		ReadBufferSize:        c.MaxHeaderBytes,
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
