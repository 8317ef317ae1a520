// Package testenv connects integration tests to the real servers of the local stack
// (docs/design.md §10), or to those the FLASHGATE_* variables name. A test that cannot
// reach its server fails; it never skips: `make test` starts the stack first.
// The credentials come from the environment or the stack's var/secrets.env
// (creds.go).
package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"
	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate/config"
)

// ID returns prefix plus a random suffix, unique across test runs.
func ID(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// Secret is a random value of 24 random bytes after prefix: past the minimum
// lengths of a JWT secret and an admin token.
func Secret(prefix string) string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// RedisAddrs is the standalone Redis.
func RedisAddrs() []string { return split(env("FLASHGATE_REDIS_ADDRS", "127.0.0.1:16379")) }

// ClusterAddrs is the 3-master Redis Cluster.
func ClusterAddrs() []string {
	return split(env("FLASHGATE_REDIS_CLUSTER_ADDRS", "127.0.0.1:17001,127.0.0.1:17002,127.0.0.1:17003"))
}

func split(s string) []string { return strings.Split(s, ",") }

const hint = " (is the stack up? `make infra-up`)"

// Redis connects to addrs and closes the client when the test ends.
func Redis(t testing.TB, addrs []string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(RedisOption(addrs))
	if err != nil {
		t.Fatalf("redis %v: %v"+hint, addrs, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Do(ctx, c.B().Ping().Build()).Error(); err != nil {
		c.Close()
		t.Fatalf("redis %v: %v"+hint, addrs, err)
	}
	t.Cleanup(c.Close)
	return c
}

// RedisTarget is one kind of Redis a test runs against.
type RedisTarget struct {
	Name   string
	Addrs  []string
	Client rueidis.Client
}

// RedisTargets are the standalone Redis and the Cluster: Redis tests run on both.
func RedisTargets(t testing.TB) []RedisTarget {
	t.Helper()
	return []RedisTarget{
		{Name: "standalone", Addrs: RedisAddrs(), Client: Redis(t, RedisAddrs())},
		{Name: "cluster", Addrs: ClusterAddrs(), Client: Redis(t, ClusterAddrs())},
	}
}

// NATSURL is the NATS server with JetStream.
func NATSURL() string { return env("FLASHGATE_NATS_URL", "nats://127.0.0.1:14222") }

// NATS connects and closes the connection when the test ends.
func NATS(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(NATSURL(), NATSOptions(nats.Timeout(3*time.Second))...)
	if err != nil {
		t.Fatalf("nats %s: %v"+hint, NATSURL(), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// MySQLDSN is the server of the local stack, database flashgate.
func MySQLDSN() string { return env("FLASHGATE_MYSQL_DSN", "root@tcp(127.0.0.1:13306)/flashgate") }

// MySQL creates a database of the test's own, dropped when the test ends, and
// returns its DSN.
func MySQL(t testing.TB) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(MySQLDSN())
	if err != nil {
		t.Fatalf("mysql dsn: %v", err)
	}
	name := ID("fgtest_")
	admin := cfg.Clone()
	admin.DBName = ""
	db, err := sql.Open("mysql", admin.FormatDSN())
	if err != nil {
		t.Fatalf("mysql: %v", err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("mysql %s: %v"+hint, cfg.Addr, err)
	}
	t.Cleanup(func() {
		db, err := sql.Open("mysql", admin.FormatDSN())
		if err == nil {
			_, _ = db.Exec("DROP DATABASE IF EXISTS " + name)
			db.Close()
		}
	})
	cfg.DBName = name
	return cfg.FormatDSN()
}

// Config is a configuration of the test's own: a fresh MySQL database, its own
// JetStream stream and subjects, free loopback ports, and the standalone Redis
// (set Redis.Addrs for the Cluster). Secrets are fixed test values.
func Config(t testing.TB) config.Config {
	t.Helper()
	c := config.Default()
	id := ID("t")
	c.Gateway.Listen = "127.0.0.1:0"
	c.Gateway.AdminListen = "127.0.0.1:0"
	c.Backend.AdminListen = "127.0.0.1:0"
	c.Redis.Addrs = RedisAddrs()
	c.Redis.Username, c.Redis.Password = RedisUsername(), RedisPassword()
	c.NATS.URL = NATSURL()
	c.NATS.User, c.NATS.Password = NATSUser(), NATSPassword()
	c.NATS.Stream = "T_" + strings.ToUpper(id)
	c.NATS.OrderSubject = id + ".orders"
	c.NATS.EventSubject = id + ".events.sale"
	c.NATS.CommandSubject = id + ".cmd.orders"
	c.NATS.Consumer = id + "-backend"
	c.Events.Stream = "T_" + strings.ToUpper(id) + "_EVENTS"
	c.Events.Subject = id + ".order_events"
	// JetStream reserves each stream's max_bytes of its store: tests by the
	// dozen at once would exhaust it with the default's.
	c.NATS.MaxBytes = 64 << 20
	c.MySQL.DSN = MySQL(t)
	// Each test's database starts empty: its backend builds the schema.
	c.MySQL.AutoMigrate = true
	// Rate limits are off: a test that is not about them would trip them (a
	// replay storm by one user, thousands of buyers from one address). The
	// tests of the limits turn them on.
	c.RateLimit = config.RateLimit{}
	// Long enough for the secret checks the processes make outside dev mode:
	// tests run the same checks production does.
	c.Auth.JWTSecret = Secret("test-secret-")
	c.Admin.Token = Secret("test-admin-")
	c.Payments.Secret = config.Secrets{Secret("test-payments-")}
	t.Cleanup(func() { deleteStream(c.NATS, c.Events.Stream) })
	return c
}

func deleteStream(c config.NATS, events string) {
	nc, err := nats.Connect(c.URL, NATSOptions()...)
	if err != nil {
		return
	}
	defer nc.Close()
	_, _ = nc.Request("$JS.API.STREAM.DELETE."+c.Stream, nil, 2*time.Second)
	// The dead-letter stream backends create beside it (bus.DeadLetterStream).
	_, _ = nc.Request("$JS.API.STREAM.DELETE."+c.Stream+"_DLQ", nil, 2*time.Second)
	// The order-events stream the leader publishes to (bus.EnsureOrderEventStream).
	_, _ = nc.Request("$JS.API.STREAM.DELETE."+events, nil, 2*time.Second)
	_, _ = nc.Request("$JS.API.STREAM.DELETE."+events+"_DLQ", nil, 2*time.Second)
}
