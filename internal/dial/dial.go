// Package dial opens the connections a flashgate process works with. The
// processes' packages (gateway/) take clients that are already dialed, so that
// how a server is reached (addresses, credentials, timeouts) is decided in one
// place and a test wires a process exactly as the CLI does.
package dial

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
)

// GatewayRedis dials Redis for a gateway: no client-side cache (every read is
// a decision), and a write timeout that only detects a dead server.
func GatewayRedis(cfg config.Redis) (rueidis.Client, error) {
	rc, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:  cfg.Addrs,
		Username:     cfg.Username,
		Password:     cfg.Password,
		DisableCache: true,
		// Only a dead-server detector: rueidis closes a pipelined connection
		// whose replies take longer, failing everything on it. Each request has
		// its own, shorter deadline (gateway.admit_timeout).
		ConnWriteTimeout: 3 * time.Second,
		Dialer:           net.Dialer{Timeout: time.Second},
		MaxFlushDelay:    cfg.MaxFlushDelay,
	})
	if err != nil {
		return nil, fmt.Errorf("redis %v: %w", cfg.Addrs, err)
	}
	return rc, nil
}

// NATS connects to NATS as the named client and opens JetStream on it.
func NATS(cfg config.NATS, name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := bus.Connect(cfg, name)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}

// Clients are a process's dialed connections. Close them after the process
// has stopped using them (after its Shutdown).
type Clients struct {
	Redis     rueidis.Client
	NATS      *nats.Conn
	JetStream jetstream.JetStream
}

// Gateway dials what a gateway needs: Redis and NATS with JetStream.
func Gateway(cfg config.Config) (*Clients, error) {
	rc, err := GatewayRedis(cfg.Redis)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	nc, js, err := NATS(cfg.NATS, "flashgate-gateway")
	if err != nil {
		rc.Close()
		return nil, fmt.Errorf("gateway: %w", err)
	}
	return &Clients{Redis: rc, NATS: nc, JetStream: js}, nil
}

// Close drains NATS (what was published is flushed first) and closes Redis.
func (c *Clients) Close() error {
	var err error
	if c.NATS != nil {
		err = c.NATS.Drain()
	}
	if c.Redis != nil {
		c.Redis.Close()
	}
	if errors.Is(err, nats.ErrConnectionClosed) {
		return nil
	}
	return err
}
