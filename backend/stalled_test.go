package backend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	driver "github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics"
	"github.com/flashgate/flashgate/mysql"
)

func TestStalled(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&driver.MySQLError{Number: 1205}, true},
		{&driver.MySQLError{Number: 1213}, true},
		{&driver.MySQLError{Number: 1040}, true},
		{&driver.MySQLError{Number: 1290}, true},
		{&driver.MySQLError{Number: 1792}, true},
		{&driver.MySQLError{Number: 1836}, true},
		{&driver.MySQLError{Number: 1969}, true},
		{&driver.MySQLError{Number: 3024}, true},
		{fmt.Errorf("batch of s: %w", &driver.MySQLError{Number: 1205}), true},
		{fmt.Errorf("batch of s: %w", context.DeadlineExceeded), true},
		{driver.ErrInvalidConn, true},
		{&driver.MySQLError{Number: 1292}, false}, // a value that fits no column: the order's fault
		{&driver.MySQLError{Number: 1406}, false},
		{errors.New("something else"), false},
		{nil, false},
	} {
		if got := stalled(c.err); got != c.want {
			t.Errorf("stalled(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestRetryDelay(t *testing.T) {
	limit := 30 * time.Second
	for _, c := range []struct {
		n    uint64
		want time.Duration
	}{{0, nakBase}, {1, nakBase}, {2, 2 * nakBase}, {5, 16 * nakBase}, {8, limit}, {1000, limit}} {
		if got := retryDelay(c.n, limit); got != c.want {
			t.Errorf("retryDelay(%d) = %v, want %v", c.n, got, c.want)
		}
	}
}

// A sale that stalls is written in smaller transactions, halving per stall
// down to one order, and back to whole batches as it writes again.
func TestStallCaps(t *testing.T) {
	var c stallCaps
	if c.get("s") != 0 {
		t.Fatal("a cap before any stall")
	}
	c.wrote("s", 100) // no cap: stays none
	if c.get("s") != 0 {
		t.Fatal("a cap after a write")
	}
	c.stalled("s", 100)
	c.stalled("s", 50)
	if got := c.get("s"); got != 25 {
		t.Fatalf("cap %d after two stalls, want 25", got)
	}
	c.stalled("s", 1)
	if got := c.get("s"); got != 1 {
		t.Fatalf("cap %d, want 1", got)
	}
	if c.get("other") != 0 {
		t.Fatal("another sale capped")
	}
	for _, want := range []int{2, 4, 8, 16, 32, 64, 0} {
		c.wrote("s", 100)
		if got := c.get("s"); got != want {
			t.Fatalf("cap %d, want %d", got, want)
		}
	}
}

// startOn is start with the backend and the test's env on MySQL dsn.
func startOn(t *testing.T, dsn string, cfgFn func(*config.Config)) *started {
	t.Helper()
	cfg := testenv.Config(t)
	cfg.MySQL.DSN = dsn
	cfg.Backend.AckWait = 2 * time.Second
	if cfgFn != nil {
		cfgFn(&cfg)
	}
	db, err := mysql.OpenDB(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := mysql.Migrate(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	rc := testenv.Redis(t, cfg.Redis.Addrs)
	e := &env{t: t, cfg: cfg, db: db, rc: rc, scripts: lua.Load()}
	e.w = newOrderWriter(db, rc, e.scripts, quiet, metrics.NewBackend())
	e.warmer = newWarmer(db, rc, e.scripts, quiet)
	t.Cleanup(func() { e.warmer.stop(context.Background()) })
	b, err := dialAndStart(t, cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Shutdown(c); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	nc := testenv.NATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &started{env: e, b: b, nc: nc, js: js}
}

// A competing transaction holds the sale's row (SELECT … FOR UPDATE) for
// longer than all of a message's deliveries wait for the lock together. MySQL
// answers the probe all along, so before, every order was taken for poison
// and dead-lettered failed; now they wait, and end confirmed once the lock goes.
func TestLockedSaleRowIsNotPoison(t *testing.T) {
	t.Parallel()
	maria := testenv.StartMariaDB(t)
	root, err := sql.Open("mysql", maria.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	// For every connection opened from now on, the backend's among them.
	if _, err := root.ExecContext(ctx(t), `SET GLOBAL innodb_lock_wait_timeout = 1`); err != nil {
		t.Fatal(err)
	}
	s := startOn(t, maria.DSN(), func(c *config.Config) {
		c.Backend.MaxDeliver = 3
		c.Backend.AckWait = 3 * time.Second
	})
	sale := spec(30, 5, nil)
	k := s.createSale(sale)

	holder, err := root.BeginTx(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	var id string
	if err := holder.QueryRowContext(ctx(t), `SELECT id FROM sales WHERE id = ? FOR UPDATE`, sale.ID).Scan(&id); err != nil {
		t.Fatal(err)
	}
	var msgs []flashgate.Order
	for i := range 6 {
		m := admit(t, s.rc, k, fmt.Sprintf("u%d", i), 1, "")
		msgs = append(msgs, m)
		s.publish(m)
	}
	// Held until every message was tried, and put back to wait, more often
	// than max_deliver (each try waits the 1 s lock wait): they wait in the
	// backend, spending no delivery.
	eventually(t, 60*time.Second, "tried past max_deliver under the lock", func() bool {
		if n := s.rows(sale.ID, "failed"); n > 0 {
			t.Fatalf("%d orders failed (dead-lettered) while the row was locked", n)
		}
		fs := s.scrape()
		return metric(fs, "flashgate_backend_outage_holds_total") >= float64(4*len(msgs)) &&
			metric(fs, "flashgate_backend_orders_waiting") == float64(len(msgs))
	})
	if n := s.rows(sale.ID, "confirmed") + s.rows(sale.ID, "failed"); n != 0 {
		t.Fatalf("%d rows written through the lock", n)
	}
	if err := holder.Rollback(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "every order confirmed", func() bool {
		return s.rows(sale.ID, "confirmed") == int64(len(msgs))
	})
	for _, m := range msgs {
		eventually(t, 10*time.Second, "confirmed in Redis", func() bool {
			st, _ := redisStatus(t, s.rc, k, m.ID)
			return st == "confirmed"
		})
	}
	if n := s.rows(sale.ID, "failed"); n != 0 {
		t.Fatalf("%d orders failed", n)
	}
	if dl := s.deadLetters(); len(dl) != 0 {
		t.Fatalf("%d dead letters", len(dl))
	}
	if got := remaining(t, s.rc, k, ""); got != 30-int64(len(msgs)) {
		t.Fatalf("remaining %d", got)
	}
	if got := s.sold(sale.ID); got != int64(len(msgs)) {
		t.Fatalf("MySQL sold %d", got)
	}
}
