// Package dial opens the connections a flashgate process works with. The
// processes' packages (gateway/, backend/) take clients that are already dialed, so that
// how a server is reached (addresses, credentials, timeouts) is decided in one
// place and a test wires a process exactly as the CLI does.
package dial

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"

	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/mysql"
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

// MySQL opens the database a backend works on and checks its schema: pending
// migrations are applied only when mysql.auto_migrate is on; otherwise an old
// schema is refused with the command that fixes it, and a half-applied or
// newer one is refused either way.
func MySQL(ctx context.Context, cfg config.MySQL) (*sql.DB, error) {
	db, err := mysql.OpenDB(cfg.DSN)
	if err != nil {
		return nil, err
	}
	if cfg.MaxOpenConns > 0 {
		db.SetMaxOpenConns(cfg.MaxOpenConns)
		db.SetMaxIdleConns(cfg.MaxOpenConns)
	}
	// Recycle connections well inside any server or proxy idle timeout.
	db.SetConnMaxLifetime(30 * time.Minute)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("mysql: %w", err)
	}
	check := mysql.CheckSchema
	if cfg.AutoMigrate {
		check = mysql.Migrate
	}
	if err := check(ctx, db); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// BackendRedis dials Redis for a backend: no client-side cache (the backend
// reads what it is about to decide on).
func BackendRedis(cfg config.Redis) (rueidis.Client, error) {
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: cfg.Addrs, Username: cfg.Username, Password: cfg.Password, DisableCache: true})
	if err != nil {
		return nil, fmt.Errorf("redis %v: %w", cfg.Addrs, err)
	}
	return rc, nil
}

// Locker dials the leader lock's own Redis client (client-side caching on: a
// deleted or taken key reaches the holder at once) with the locker options
// the backend chose (backend.LeaderLockerOption).
func Locker(cfg config.Redis, opt rueidislock.LockerOption) (rueidislock.Locker, error) {
	opt.ClientOption = rueidis.ClientOption{InitAddress: cfg.Addrs, Username: cfg.Username, Password: cfg.Password}
	l, err := rueidislock.NewLocker(opt)
	if err != nil {
		return nil, fmt.Errorf("leader lock on %v: %w", cfg.Addrs, err)
	}
	return l, nil
}

// BackendClients are a backend's dialed connections. The leader lock's
// locker is handed to the backend, which closes it when it leaves the
// election; Close closes the rest, after the backend's Shutdown.
type BackendClients struct {
	DB        *sql.DB
	Redis     rueidis.Client
	NATS      *nats.Conn
	JetStream jetstream.JetStream
	Locker    rueidislock.Locker
}

// Backend dials what a backend needs, MySQL first (its schema is checked
// before anything else is dialed), then Redis, NATS with JetStream, and the
// leader lock. What was dialed is closed again if a later dial fails.
func Backend(ctx context.Context, cfg config.Config, lock rueidislock.LockerOption) (*BackendClients, error) {
	c := &BackendClients{}
	var err error
	if c.DB, err = MySQL(ctx, cfg.MySQL); err != nil {
		return nil, err
	}
	if c.Redis, err = BackendRedis(cfg.Redis); err != nil {
		c.Close()
		return nil, err
	}
	if c.NATS, c.JetStream, err = NATS(cfg.NATS, "flashgate-backend"); err != nil {
		c.Close()
		return nil, err
	}
	if c.Locker, err = Locker(cfg.Redis, lock); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Close flushes NATS (acks are fire-and-forget publishes: they go out before
// the connection does), then closes NATS, Redis and MySQL.
func (c *BackendClients) Close() {
	if c.NATS != nil {
		_ = c.NATS.FlushTimeout(2 * time.Second)
		c.NATS.Close()
	}
	if c.Redis != nil {
		c.Redis.Close()
	}
	if c.DB != nil {
		c.DB.Close()
	}
}
