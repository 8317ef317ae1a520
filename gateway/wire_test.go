package gateway

import (
	"context"

	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/dial"
)

// dialAndStart wires a gateway as the CLI does (internal/wire, which this
// package's tests cannot import): dial the clients, start the gateway on them.
// The caller shuts the gateway down, then closes the clients.
func dialAndStart(ctx context.Context, cfg config.Config) (*Gateway, *dial.Clients, error) {
	c, err := dial.Gateway(cfg)
	if err != nil {
		return nil, nil, err
	}
	g, err := Start(ctx, Deps{Redis: c.Redis, NATS: c.NATS, JetStream: c.JetStream}, cfg.GatewayOptions())
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return g, c, nil
}
