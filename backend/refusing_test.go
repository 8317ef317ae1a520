package backend

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// The replies a Redis gives when it cannot take a write now, as the server
// really sends them (a private Redis), are outages; a script's own refusal
// and a wrong type are not.
func TestRedisRefusalsAreOutages(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	admin := testenv.Redis(t, []string{srv.Addr})
	do := func(c rueidis.Client, args ...string) error {
		return c.Do(ctx(t), c.B().Arbitrary(args[0]).Args(args[1:]...).Build()).Error()
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	const user, pw = "probe_user", "probe-password"
	must(do(admin, "ACL", "SETUSER", user, "on", ">"+pw, "~*", "&*", "+@all"))
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, Username: user, Password: pw,
		DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := []string{"fg:{s:x}:meta:probe"}
	probe := func() error { return lua.ProbeWrite(ctx(t), c, key[0], time.Second) }
	if err := probe(); err != nil {
		t.Fatalf("probe on a Redis that writes: %v", err)
	}
	outage := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
		if !redisUnavailable(err) || !unavailable(fmt.Errorf("batch of x: %w", err)) {
			t.Errorf("%s: %q is not taken for an outage", what, err)
		}
	}
	must(do(admin, "ACL", "SETUSER", user, "-@scripting"))
	outage("no @scripting", probe())
	must(do(admin, "ACL", "SETUSER", user, "+@scripting", "-@write"))
	outage("a script's write without @write", probe())
	outage("a write without @write", do(c, "SET", "k", "v"))
	must(do(admin, "ACL", "SETUSER", user, "+@write"))
	must(do(admin, "CONFIG", "SET", "maxmemory", "1"))
	outage("over maxmemory", probe())
	if err := do(c, "GET", "k"); err != nil && !rueidis.IsRedisNil(err) {
		t.Fatalf("a read over maxmemory: %v", err) // what the old probe (EXISTS) saw: all well
	}
	must(do(admin, "CONFIG", "SET", "maxmemory", "0"))
	must(do(admin, "REPLICAOF", "127.0.0.1", strconv.Itoa(testenv.FreePort(t))))
	outage("a replica", probe())
	must(do(admin, "REPLICAOF", "NO", "ONE"))
	if err := probe(); err != nil {
		t.Fatalf("probe once Redis writes again: %v", err)
	}

	// Not outages: the scripts' own refusals, a key of the wrong type.
	bad := rueidis.NewLuaScript(`return redis.error_reply('release: order 1 is in region "x"')`)
	if err := bad.Exec(ctx(t), c, key, nil).Error(); err == nil || redisUnavailable(err) {
		t.Errorf("a script's refusal: %v taken for an outage", err)
	}
	must(do(c, "SET", "str", "v"))
	if err := do(c, "HSET", "str", "f", "v"); err == nil || redisUnavailable(err) {
		t.Errorf("WRONGTYPE: %v taken for an outage", err)
	}
}

// redisUser makes an ACL user with every right on the tests' Redis for a
// backend of the test's own, and answers its name, password and a function
// that changes its rights (ACL SETUSER name rules...).
func redisUser(t *testing.T) (name, password string, set func(rules ...string)) {
	t.Helper()
	admin := testenv.Redis(t, testenv.RedisAddrs())
	name, password = testenv.ID("fgw"), testenv.Secret("pw-")
	set = func(rules ...string) {
		t.Helper()
		args := append([]string{"SETUSER", name}, rules...)
		if err := admin.Do(ctx(t), admin.B().Arbitrary("ACL").Args(args...).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	set("on", ">"+password, "~*", "&*", "+@all")
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		admin.Do(c, admin.B().Arbitrary("ACL").Args("DELUSER", name).Build())
	})
	return name, password, set
}

// TestWriteRefusingRedisOrdersWait: the backend's Redis user loses
// @scripting while 202s wait to be written, then gets it back. Redis answers
// reads all along. Before, the orders were poison (the probe was a read):
// dead-lettered and failed, with max_deliver 3 within seconds; and each
// waiting order spent deliveries on tries bound to fail, by back-offs of the
// backend and the server stacked. Now every one waits, spending no delivery,
// and is confirmed once Redis takes writes again.
func TestWriteRefusingRedisOrdersWait(t *testing.T) {
	t.Parallel()
	for _, md := range []int{0, 3} {
		t.Run(fmt.Sprintf("max_deliver=%d", md), func(t *testing.T) {
			t.Parallel()
			user, pw, acl := redisUser(t)
			s := start(t, testenv.RedisAddrs(), func(c *config.Config) {
				c.Redis.Username, c.Redis.Password = user, pw
				if md > 0 {
					c.Backend.MaxDeliver = md
				}
				// Long enough that a loaded machine keeps the held
				// messages' ack wait going (InProgress every third of it).
				c.Backend.AckWait = 6 * time.Second
			})
			sale := spec(100, 5, nil)
			k := s.createSale(sale)
			acl("-@scripting")
			const n = 20
			var accepted []uint64
			for i := range n {
				m := admit(t, s.rc, k, "u"+strconv.Itoa(i), 1, "") // the gateway's own user admits
				accepted = append(accepted, m.ID)
				s.publish(m)
			}
			// The refusal lasts until the backend has waited through 8 probes
			// of the sale's tags (0.25 s doubling to 2 s apart: about 12 s,
			// twice the ack wait); a backend that tries the orders instead
			// spends their deliveries, and the wait ends when 3 per order are
			// spent or one failed.
			eventually(t, 60*time.Second, "orders waiting through the refusal", func() bool {
				fs := s.scrape()
				if metric(fs, "flashgate_backend_outage_probes_total") >= 8 &&
					metric(fs, "flashgate_backend_orders_waiting") == n {
					return true
				}
				return s.rows(sale.ID, "failed") > 0 || s.deliveries() >= 3*n
			})
			acl("+@scripting")
			eventually(t, 60*time.Second, "every order written", func() bool {
				return s.rows(sale.ID, "confirmed")+s.rows(sale.ID, "failed") == n
			})
			if f := s.rows(sale.ID, "failed"); f != 0 {
				t.Fatalf("%d of %d accepted orders failed", f, n)
			}
			if dl := s.deadLetters(); len(dl) != 0 {
				t.Fatalf("%d dead letters", len(dl))
			}
			for _, id := range accepted {
				eventually(t, 10*time.Second, "confirmed in Redis", func() bool {
					st, _ := redisStatus(t, s.rc, k, id)
					return st == string(flashgate.OrderConfirmed)
				})
			}
			eventually(t, 10*time.Second, "consumer idle", s.consumerIdle)
			// Waiting spent no delivery: one each, the one that was written.
			if d := s.deliveries(); d != n {
				t.Errorf("%d deliveries for %d orders: the refusal spent deliveries", d, n)
			}
			if r := check(t, s.env, sale.ID, accepted); !r.OK() || r.Sold != n {
				t.Fatalf("audit: %v", r)
			}
			if got := remaining(t, s.rc, k, ""); got != 100-n {
				t.Fatalf("remaining %d", got)
			}
		})
	}
}

// deliveries is how many deliveries the durable consumer has made.
func (s *started) deliveries() uint64 {
	s.t.Helper()
	c, err := s.js.Consumer(ctx(s.t), s.cfg.NATS.Stream, s.cfg.NATS.Consumer)
	if err != nil {
		s.t.Fatal(err)
	}
	info, err := c.Info(ctx(s.t))
	if err != nil {
		s.t.Fatal(err)
	}
	return info.Delivered.Consumer
}

// TestBucketMasterRefusingWritesOrdersWait: a sale split over three buckets
// on a Cluster of its own; the master of one bucket, not the one holding the
// sale's meta, refuses writes (over maxmemory: OOM) while orders of buyers
// homed there wait to be written. Before, the probe read the sale's meta on
// another master and answered: the orders were poison, dead-lettered and
// failed (and their release, refused by the same master, left the messages
// out of deliveries in the stream). Now they wait, spending no delivery, and
// are confirmed once the master takes writes again.
func TestBucketMasterRefusingWritesOrdersWait(t *testing.T) {
	t.Parallel()
	cluster := testenv.StartRedisCluster(t, 3, 0, 5*time.Second)
	s := start(t, cluster.Addrs(), func(c *config.Config) {
		c.Backend.MaxDeliver = 3
		c.Backend.AckWait = 6 * time.Second
	})
	sale := spec(60, 5, nil)
	k := s.createSplitSale(sale, 3)
	meta := cluster.MasterOf(k.Meta)
	var bucket *lua.Keys
	for _, b := range k.Buckets() {
		if m := cluster.MasterOf(b.Meta); m != nil && m != meta {
			bucket = b
			break
		}
	}
	if meta == nil || bucket == nil {
		t.Fatalf("no bucket away from the meta's master (%v)", meta)
	}
	master := cluster.MasterOf(bucket.Meta)
	var orders []flashgate.Order
	for i := 0; len(orders) < 6; i++ {
		u := "u" + strconv.Itoa(i)
		if k.Home(u) != bucket {
			continue
		}
		o, out := buy(t, s.env, k, u, 1, "")
		if out != lua.Admitted {
			t.Fatalf("%s: %v", u, out)
		}
		orders = append(orders, o)
	}
	cli := func(args ...string) {
		t.Helper()
		if out, err := cluster.Cli(master, args...); err != nil {
			t.Fatalf("%v: %v %s", args, err, out)
		}
	}
	cli("config", "set", "maxmemory", "1")
	t.Cleanup(func() { _, _ = cluster.Cli(master, "config", "set", "maxmemory", "0") })
	for _, o := range orders {
		s.publish(o)
	}
	n := len(orders)
	eventually(t, 60*time.Second, "orders waiting through the refusal", func() bool {
		fs := s.scrape()
		if metric(fs, "flashgate_backend_outage_probes_total") >= 8 &&
			metric(fs, "flashgate_backend_orders_waiting") == float64(n) {
			return true
		}
		return s.rows(sale.ID, "failed") > 0 || s.deliveries() >= uint64(3*n)
	})
	cli("config", "set", "maxmemory", "0")
	eventually(t, 60*time.Second, "every order written", func() bool {
		return s.rows(sale.ID, "confirmed")+s.rows(sale.ID, "failed") == int64(n)
	})
	if f := s.rows(sale.ID, "failed"); f != 0 {
		t.Fatalf("%d of %d accepted orders failed", f, n)
	}
	if dl := s.deadLetters(); len(dl) != 0 {
		t.Fatalf("%d dead letters", len(dl))
	}
	for _, o := range orders {
		eventually(t, 10*time.Second, "confirmed in Redis", func() bool {
			st, _ := redisStatus(t, s.rc, bucket, o.ID)
			return st == string(flashgate.OrderConfirmed)
		})
	}
	eventually(t, 10*time.Second, "consumer idle", s.consumerIdle)
	if d := s.deliveries(); d != uint64(n) {
		t.Errorf("%d deliveries for %d orders: the refusal spent deliveries", d, n)
	}
}
