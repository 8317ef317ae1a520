package backend

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/audit"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics"
	"github.com/flashgate/flashgate/mysql"
	"github.com/flashgate/flashgate/orderid"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// env is one test's MySQL database (migrated), a Redis, and an order writer on them.
type env struct {
	t       *testing.T
	cfg     config.Config
	db      *sql.DB
	rc      rueidis.Client
	scripts *lua.Scripts
	w       *orderWriter
	warmer  *warmer
}

func newEnv(t *testing.T, redisAddrs []string) *env {
	t.Helper()
	cfg := testenv.Config(t)
	cfg.Redis.Addrs = redisAddrs
	db, err := mysql.OpenDB(cfg.MySQL.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := mysql.Migrate(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	rc := testenv.Redis(t, redisAddrs)
	e := &env{t: t, cfg: cfg, db: db, rc: rc, scripts: lua.Load()}
	e.w = newOrderWriter(db, rc, e.scripts, quiet, metrics.NewBackend())
	e.warmer = newWarmer(db, rc, e.scripts, quiet)
	t.Cleanup(func() { e.warmer.stop(context.Background()) })
	return e
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// spec is an active sale: started an hour ago, ending in an hour.
func spec(total, limit int64, regions map[string]int64) *flashgate.Sale {
	now := time.Now().UTC().Truncate(time.Millisecond)
	return &flashgate.Sale{
		ID: testenv.ID("s"), Title: "test sale", PriceCents: 990, Total: total,
		StartsAt: now.Add(-time.Hour), EndsAt: now.Add(time.Hour),
		PerUserLimit: limit, PerOrderMax: limit, Regions: regions,
	}
}

// cleanRedis removes the sale's keys when the test ends (the Redis is shared).
func cleanRedis(t testing.TB, rc rueidis.Client, s *flashgate.Sale) {
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		k := lua.KeysFor(s.ID, s.RegionNames())
		keys := []string{k.Meta, k.Users, k.Resv, k.Orders, k.Idem, warmLockKey(s.ID)}
		_, stock := k.StockKeys()
		keys = append(keys, stock...)
		if len(s.Regions) > 0 {
			keys = append(keys, "fg:{s:"+s.ID+"}:stock")
		}
		rc.Do(c, rc.B().Del().Key(keys...).Build())
		lua.Unindex(c, rc, s.ID)
	})
}

// createSale writes the sale to MySQL and warms Redis from it.
func (e *env) createSale(s *flashgate.Sale) *lua.Keys {
	e.t.Helper()
	if err := insertSale(ctx(e.t), e.db, s, time.Now().UTC()); err != nil {
		e.t.Fatal(err)
	}
	cleanRedis(e.t, e.rc, s)
	did, err := e.warmer.warm(ctx(e.t), s.ID)
	if err != nil || !did {
		e.t.Fatalf("warm %s: did=%v err=%v", s.ID, did, err)
	}
	return lua.KeysFor(s.ID, s.RegionNames())
}

// warmWith warms Redis with remaining units per region, whatever MySQL says.
func (e *env) warmWith(s *flashgate.Sale, remaining map[string]int64) *lua.Keys {
	e.t.Helper()
	cleanRedis(e.t, e.rc, s)
	if did, err := e.scripts.Warm(ctx(e.t), e.rc, s, remaining); err != nil || !did {
		e.t.Fatalf("warm %s: did=%v err=%v", s.ID, did, err)
	}
	return lua.KeysFor(s.ID, s.RegionNames())
}

// nextID makes the tests' order ids as a gateway does (orderid): the writer
// checks an order's created time against its id's (distrust.go). Its node is
// drawn at random, so that test runs sharing a database do not meet.
var nextID = testIDs{orderid.New(rand.IntN(orderid.MaxNode + 1))}

// testIDs hands out order ids; Add ignores its argument (the tests' ids were
// once a counter) and answers the next id.
type testIDs struct{ g *orderid.Generator }

func (t testIDs) Add(uint64) uint64 { return t.g.Next() }

// admit runs the admission script like a gateway and returns the message the
// gateway would publish.
func admit(t testing.TB, rc rueidis.Client, k *lua.Keys, user string, qty int64, region string) flashgate.Order {
	t.Helper()
	now := time.Now()
	a := lua.AdmitArgs{User: user, Quantity: qty, OrderID: nextID.Add(1), Now: now, Region: region, PayBy: now.Add(15 * time.Minute)}
	got, err := lua.Load().Admit(ctx(t), rc, k, a)
	if err != nil {
		t.Fatalf("admit: %v", err)
	}
	if got.Outcome != lua.Admitted {
		t.Fatalf("admit %s x%d: %v", user, qty, got.Outcome)
	}
	// The message carries Redis's time of the admission, as the gateway's does.
	return flashgate.Order{ID: got.OrderID, SaleID: k.Sale, UserID: user, Quantity: qty, Region: region, Status: flashgate.OrderPending,
		CreatedAt: ms(got.At.UnixMilli()), ExpiresAt: ms(got.At.Add(a.PayBy.Sub(now)).UnixMilli())}
}

func ids(msgs []flashgate.Order) []uint64 {
	out := make([]uint64, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

func (e *env) process(sale string, msgs []flashgate.Order) []outcome {
	e.t.Helper()
	out, err := e.w.process(ctx(e.t), sale, msgs)
	if err != nil {
		e.t.Fatalf("process: %v", err)
	}
	if len(out) != len(msgs) {
		e.t.Fatalf("%d outcomes for %d messages", len(out), len(msgs))
	}
	return out
}

func (e *env) queryInt(q string, args ...any) int64 {
	e.t.Helper()
	var n sql.NullInt64
	if err := e.db.QueryRowContext(ctx(e.t), q, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", q, err)
	}
	return n.Int64
}

func (e *env) sold(sale string) int64 {
	return e.queryInt(`SELECT sold FROM sales WHERE id = ?`, sale)
}

func (e *env) rows(sale, status string) int64 {
	return e.queryInt(`SELECT COUNT(*) FROM orders WHERE sale_id = ? AND status = ?`, sale, status)
}

// order reads one order row's status and reason.
func (e *env) order(id uint64) (status, reason string, ok bool) {
	e.t.Helper()
	err := e.db.QueryRowContext(ctx(e.t), `SELECT status, reason FROM orders WHERE id = ?`, id).Scan(&status, &reason)
	if err == sql.ErrNoRows {
		return "", "", false
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return status, reason, true
}

func (e *env) units(sale, user string) int64 {
	return e.queryInt(`SELECT units FROM user_purchases WHERE sale_id = ? AND user_id = ?`, sale, user)
}

// redisStatus is the order's status and reason as the gateway reads it.
func redisStatus(t testing.TB, rc rueidis.Client, k *lua.Keys, id uint64) (string, string) {
	t.Helper()
	rec, ok, err := lua.Order(ctx(t), rc, k, id)
	if err != nil || !ok {
		t.Fatalf("redis order %d: ok=%v err=%v", id, ok, err)
	}
	return string(rec.Status), rec.Reason
}

func reservations(t testing.TB, rc rueidis.Client, k *lua.Keys) int {
	t.Helper()
	r, err := lua.Reservations(ctx(t), rc, k)
	if err != nil {
		t.Fatal(err)
	}
	return len(r)
}

func remaining(t testing.TB, rc rueidis.Client, k *lua.Keys, region string) int64 {
	t.Helper()
	m, err := lua.Remaining(ctx(t), rc, k)
	if err != nil {
		t.Fatal(err)
	}
	n, ok := m[region]
	if !ok {
		t.Fatalf("no stock key for region %q", region)
	}
	return n
}

func check(t testing.TB, e *env, sale string, accepted []uint64) audit.Report {
	t.Helper()
	r, err := audit.Check(ctx(t), e.db, e.rc, sale, accepted)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	// A liveness wait, not a speed claim (tests that measure a time log it):
	// `make test` runs every package at once with -race on two cores, where
	// anything may take a few times longer than alone.
	within *= 3
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ms is a time as the orders stream carries it: Unix milliseconds, in UTC.
func ms(v int64) time.Time { return time.UnixMilli(v).UTC() }

// setPayBy sets the payment deadline of orders, written already, to payBy in
// MySQL (the writer sets it from orders.payment_timeout).
func (e *env) setPayBy(orders []flashgate.Order, payBy time.Time) {
	e.t.Helper()
	for part := range slices.Chunk(orders, 1000) {
		args := []any{ms(payBy.UnixMilli())}
		q := `UPDATE orders SET expires_at = ? WHERE id IN (?` + strings.Repeat(",?", len(part)-1) + `)`
		for _, o := range part {
			args = append(args, o.ID)
		}
		if _, err := e.db.ExecContext(ctx(e.t), q, args...); err != nil {
			e.t.Fatal(err)
		}
	}
}

// poisonInserts makes MySQL refuse, every time, any orders row of user but a
// dead-lettered one (testenv.PoisonOrders: users whose id starts with user).
func (e *env) poisonInserts(user string) { testenv.PoisonOrders(e.t, e.db, user) }

// idAt is an order id a gateway whose clock read at would make.
func idAt(at time.Time) uint64 {
	return orderid.NewClock(rand.IntN(orderid.MaxNode+1), func() time.Time { return at }).Next()
}

// plant writes o's reservation and record into Redis as if an admission had
// made them (under limits Redis no longer has, or on a Redis that failed
// over): Redis knows the order, whatever its stock and counters say.
func plant(t testing.TB, rc rueidis.Client, k *lua.Keys, o flashgate.Order) {
	t.Helper()
	o.Status = flashgate.OrderPending
	sid := strconv.FormatUint(o.ID, 10)
	for key, v := range map[string]string{k.Resv: lua.EncodeResv(&o), k.Orders: lua.EncodeRecord(&o)} {
		if err := rc.Do(ctx(t), rc.B().Hset().Key(key).FieldValue().FieldValue(sid, v).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
}
