package backend

import (
	"testing"

	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/dial"
)

// dialAndStart wires a backend as the CLI does (internal/wire, which this
// package's tests cannot import): dial the clients, start the backend on
// them. The clients are closed at the test's end, after any Shutdown the test
// registered (cleanups run last-registered first).
func dialAndStart(t *testing.T, cfg config.Config) (*Backend, error) {
	t.Helper()
	c, err := dial.Backend(ctx(t), cfg, LeaderLockerOption(leaderValidity))
	if err != nil {
		return nil, err
	}
	b, err := Start(ctx(t), Deps{DB: c.DB, Redis: c.Redis, NATS: c.NATS, JetStream: c.JetStream, Locker: c.Locker}, cfg.BackendOptions())
	if err != nil {
		c.Close()
		return nil, err
	}
	t.Cleanup(c.Close)
	return b, nil
}
