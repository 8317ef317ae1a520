// Package wire builds flashgate's processes from the configuration: it dials
// the servers (internal/dial), hands each process the clients and its own
// slice of the configuration, and owns the shutdown order. The CLI and the
// tests that run a process in-process share it, so both wire it the same way.
package wire

import (
	"context"
	"log/slog"
	"sync"

	"github.com/flashgate/flashgate/backend"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/gateway"
	"github.com/flashgate/flashgate/internal/dial"
)

// Gateway is a running gateway together with the clients it was started on.
type Gateway struct {
	*gateway.Gateway
	clients *dial.Clients
}

// StartGateway dials Redis and NATS and starts a gateway on them. If the
// gateway does not start, the clients are closed again.
func StartGateway(ctx context.Context, cfg config.Config) (*Gateway, error) {
	c, err := dial.Gateway(cfg)
	if err != nil {
		return nil, err
	}
	deps := gateway.Deps{Redis: c.Redis, NATS: c.NATS, JetStream: c.JetStream}
	g, err := gateway.Start(ctx, deps, cfg.GatewayOptions())
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return &Gateway{Gateway: g, clients: c}, nil
}

// Shutdown stops serving and drains in-flight requests (gateway.Shutdown,
// which also gives back the order-id node, a Redis call), and only then closes
// the clients, which nothing uses any more. Idempotent.
func (g *Gateway) Shutdown(ctx context.Context) error {
	err := g.Gateway.Shutdown(ctx)
	if cerr := g.clients.Close(); cerr != nil {
		// The answer is the drain's, as before the clients were closed here:
		// a connection that went away while closing loses nothing of ours.
		slog.Warn("gateway: closing clients", "err", cerr)
	}
	return err
}

// RunGateway serves a gateway until ctx ends, then shuts it down within
// gateway.shutdown_timeout. Stopped while it was still starting (ctx ended),
// it returns nil: a stop, not a failure.
func RunGateway(ctx context.Context, cfg config.Config) error {
	g, err := StartGateway(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Gateway.ShutdownTimeout)
	defer cancel()
	return g.Shutdown(sctx)
}

// Backend is a running backend together with the clients it was started on.
type Backend struct {
	*backend.Backend
	clients   *dial.BackendClients
	closeOnce sync.Once
}

// StartBackend dials MySQL (checking its schema), Redis, NATS and the leader
// lock, and starts a backend on them. If the backend does not start, the
// clients are closed again.
func StartBackend(ctx context.Context, cfg config.Config) (*Backend, error) {
	c, err := dial.Backend(ctx, cfg, backend.LeaderLockerOption(backend.LeaderValidity))
	if err != nil {
		return nil, err
	}
	deps := backend.Deps{DB: c.DB, Redis: c.Redis, NATS: c.NATS, JetStream: c.JetStream, Locker: c.Locker}
	b, err := backend.Start(ctx, deps, cfg.BackendOptions())
	if err != nil {
		c.Close()
		return nil, err
	}
	return &Backend{Backend: b, clients: c}, nil
}

// Shutdown stops consuming and drains the batch in hand and the order
// commands, releases the leadership (backend.Shutdown), and only then closes
// the clients, flushing the last acks. Idempotent.
func (b *Backend) Shutdown(ctx context.Context) error {
	err := b.Backend.Shutdown(ctx)
	b.closeOnce.Do(b.clients.Close)
	return err
}

// RunBackend serves a backend until ctx ends, then shuts it down within
// backend.shutdown_timeout.
func RunBackend(ctx context.Context, cfg config.Config) error {
	b, err := StartBackend(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting
		}
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
