package chaos

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/audit"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
)

// The fault classes of issue 24, where Redis is rebuilt, refused or changed
// under orders that are still on their way: each checks the audit's
// invariants and the history of what every client saw (history_test.go).
func init() {
	scenarios = append(scenarios,
		scenario{"redis refuses writes, orders wait", redisRefusesWrites},
		scenario{"cancels, expiry storm, redis lost", cancelsExpiryRedisLost},
		scenario{"patch limits during a flood", patchDuringFlood},
		scenario{"12 buckets: meta's master lost", func(t *testing.T) { splitMasterLost(t, true) }},
		scenario{"12 buckets: a bucket's master lost", func(t *testing.T) { splitMasterLost(t, false) }},
	)
}

// killBackends kills every backend (-9); startBackends starts them again and
// finds the leader.
func (st *stack) killBackends() {
	for _, b := range st.backends {
		b.kill()
	}
}

func (st *stack) startBackends() {
	st.t.Helper()
	for _, b := range st.backends {
		b.start()
	}
	st.backend = st.leader()
}

// startBackendsNoLeader starts every backend again without waiting for one
// to lead: the leader lock is a Redis write, and while Redis refuses writes
// none can take it.
func (st *stack) startBackendsNoLeader() {
	st.t.Helper()
	for _, b := range st.backends {
		b.start()
	}
}

// redisConfigSet runs CONFIG SET param value on every master (on a Redis
// Cluster each node has its own configuration).
func (st *stack) redisConfigSet(param, value string) {
	st.t.Helper()
	if st.rcluster == nil {
		rc := testenv.Redis(st.t, []string{st.redis.Addr})
		if err := rc.Do(context.Background(), rc.B().ConfigSet().ParameterValue().ParameterValue(param, value).Build()).Error(); err != nil {
			st.t.Fatalf("CONFIG SET %s %s: %v", param, value, err)
		}
		return
	}
	for _, m := range st.rcluster.Masters() {
		if out, err := st.rcluster.Cli(m, "config", "set", param, value); err != nil || out != "OK" {
			st.t.Fatalf("CONFIG SET %s %s on %s: %v %s", param, value, m.Addr, err, out)
		}
	}
}

// refusal is how long Redis refuses writes in redisRefusesWrites: longer
// than three deliveries of a message take together (ack wait 2 s each, and
// the backend's own back-off), so that a backend taking the refusal for a
// poison message dead-letters the waiting orders within it.
const refusal = 20 * time.Second

// redisRefusesWrites: orders wait in the stream (every backend killed
// mid-flood) when Redis starts refusing every write (maxmemory 1 with
// noeviction: each write answers OOM, reads still work). The backends come
// back and meet the refusal for 20 s, with max_deliver 3: the waiting 202s
// must wait it out, not be dead-lettered failed. Buyers meanwhile are
// answered 503 (fail closed), and once Redis takes writes again new buyers
// are admitted.
func redisRefusesWrites(t *testing.T) {
	st := newStackWith(t, stackOpts{env: []string{"FLASHGATE_BACKEND_MAX_DELIVER=3"}})
	s := st.createSale(6000, 1)
	requests, accepted := st.flood(s.ID, 3000, 3000, func() {
		t.Logf("killing every backend: the flood's orders wait in the stream")
		st.killBackends()
	})
	st.redisConfigSet("maxmemory-policy", "noeviction")
	st.redisConfigSet("maxmemory", "1")
	refused := time.Now()
	st.startBackendsNoLeader()
	// Buyers during the refusal: nothing can be reserved.
	more, during := st.flood(s.ID, 1000, 1000, nil)
	requests += more
	if len(during) != 0 {
		t.Errorf("%d purchases answered 202 while Redis refused every write", len(during))
	}
	time.Sleep(time.Until(refused.Add(refusal)))
	st.redisConfigSet("maxmemory", "0")
	st.faultEnd = time.Now()
	st.backend = st.leader()
	dead := backendCounter(t, st, `flashgate_backend_dead_letters_total{kind="poison"}`)
	// After: new buyers are admitted again.
	more, after := st.flood(s.ID, 1000, 1000, nil)
	requests += more
	if len(after) == 0 {
		t.Errorf("no purchase admitted once Redis took writes again")
	}
	accepted = append(accepted, after...)
	t.Logf("%d accepted before the refusal, %d after it; %v dead-lettered as poison during it", len(accepted)-len(after), len(after), dead)
	if dead != 0 {
		t.Errorf("%v orders dead-lettered as poison while Redis refused writes", dead)
	}
	rep, rec := st.settle(s.ID, accepted)
	record(t, "redis refuses writes, orders wait", requests, accepted, rep, rec)
}

// cancelsExpiryRedisLost: a sale with a payment timeout of 8 s. Of the
// first flood's orders a quarter is canceled by its buyer, a quarter paid,
// and the rest expires unpaid (the storm); right after it Redis loses
// everything (FLUSHALL on every master). Once the sale is warm again (the
// leader's pass rewarms it, and restocks what was canceled in the last
// minute), new buyers flood it while every buyer who canceled cancels again,
// and the operator's reconcile runs twice. A canceled or expired unit goes
// back on sale once: new buyers then buy what is left, and every 202 is a
// confirmed order (no phantom unit sold twice and failed by MySQL), the
// ledger balances and no buyer's count is off.
func cancelsExpiryRedisLost(t *testing.T) {
	st := newStackWith(t, stackOpts{env: []string{"FLASHGATE_ORDERS_PAYMENT_TIMEOUT=8s"}})
	s := st.createSale(3000, 1)
	groups := st.buyers(2000, true)
	requests := st.keyedFlood(s.ID, groups, 1, nil)
	accepted := acceptedOf(groups)
	db, err := mysql.OpenDB(st.cfg.MySQL.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	waitCount(t, db, s.ID, "status IN ('confirmed','paid','canceled','failed')", int64(len(accepted)), 60*time.Second)

	// Each accepted buyer, by turn: cancel, pay, leave unpaid, leave unpaid.
	type held struct {
		b  *buyer
		gw int
	}
	var all []held
	for i, g := range groups {
		for _, b := range g {
			if b.accepted() != 0 {
				all = append(all, held{b, i})
			}
		}
	}
	var canceled []held
	var paid, unpaid atomic.Int64
	var mu sync.Mutex
	each(16, len(all), func(j int) {
		h := all[j]
		op := []string{"cancel", "pay", "", ""}[j%4]
		if op == "" {
			unpaid.Add(1)
			return
		}
		status, code, _ := st.orderCall(st.gateways[h.gw].addr, s.ID, h.b.user, h.b.tok, h.b.accepted(), op)
		switch {
		case status == 200 && op == "cancel":
			mu.Lock()
			canceled = append(canceled, h)
			mu.Unlock()
		case status == 200:
			paid.Add(1)
		default:
			t.Logf("%s of %s's order: %d %s", op, h.b.user, status, code)
		}
	})
	t.Logf("%d orders: %d canceled, %d paid, %d left to expire", len(all), len(canceled), paid.Load(), unpaid.Load())
	waitCount(t, db, s.ID, "status = 'canceled' AND reason = 'expired'", unpaid.Load(), 90*time.Second)

	// Redis loses everything right after the storm, while the leader's own
	// pass still restocks these orders (it looks a minute back).
	rc := testenv.Redis(t, st.cfg.Redis.Addrs)
	if err := st.flushRedis(rc); err != nil {
		t.Fatalf("FLUSHALL: %v", err)
	}
	t.Logf("redis lost everything after the storm")
	st.waitWarm(s.ID)
	st.faultEnd = time.Now()
	if red, err := audit.RedisLedger(context.Background(), rc, s.ID, nil); err == nil {
		t.Logf("warm again: redis remaining %d, reserved %d; %d units were never paid for", red.Remaining, red.Reserved, 3000-paid.Load())
	}
	// New buyers buy what is left, while the buyers who canceled cancel
	// again (a 503 is retried) and read their order.
	more, later := st.flood(s.ID, 6000, 6000, func() {
		each(16, len(canceled), func(j int) {
			h := canceled[j]
			for range 50 {
				status, _, _ := st.orderCall(st.gateways[h.gw].addr, s.ID, h.b.user, h.b.tok, h.b.accepted(), "cancel")
				if status != 503 && status != 0 {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			st.orderCall(st.gateways[h.gw].addr, s.ID, h.b.user, h.b.tok, h.b.accepted(), "")
		})
	})
	requests += more
	accepted = append(accepted, later...)
	// Then the operator's reconcile (every canceled order), twice as a
	// runbook rerun would.
	for range 2 {
		code, b := st.admin("POST", "/admin/v1/sales/"+s.ID+"/reconcile", nil)
		if code != 200 {
			t.Errorf("reconcile: %d %s", code, b)
		}
	}
	rep, rec := st.settle(s.ID, accepted)
	left := 3000 - paid.Load()
	t.Logf("after the loss: %d more accepted of the %d units not paid for; sold %d, redis remaining %d", len(later), left, rep.Sold, rep.RedisRemaining)
	if rep.Sold != 3000 || rep.RedisRemaining != 0 {
		t.Errorf("sold %d of 3000, %d left in Redis, after 6000 more buyers", rep.Sold, rep.RedisRemaining)
	}
	record(t, "cancels, expiry storm, redis lost", requests+int64(len(all)), accepted, rep, rec)
}

// patchDuringFlood: a sale limited to 1 unit a buyer and 2 a phone (three
// buyers a phone, each asking three times); mid-flood an operator raises
// both (2 a buyer, 4 a phone). Every purchase the new headroom admits must
// become a confirmed order: the backends' guards follow the PATCH; and no
// buyer or phone ends beyond the limit it met.
func patchDuringFlood(t *testing.T) {
	st := newStack(t)
	limits := []flashgate.Limit{{Dimension: flashgate.DimPhone, Max: 2}}
	s := st.createLimited(4000, 1, 0, limits)
	requests, accepted := st.floodPhones(s.ID, 3000, 9000, 1000, func() {
		code, b := st.patchSale(s.ID, map[string]any{"per_user_limit": 2,
			"limits": []flashgate.Limit{{Dimension: flashgate.DimPhone, Max: 4, Of: flashgate.OfUnits, Per: flashgate.PerSale}}})
		if code != 200 {
			t.Fatalf("PATCH: %d %s", code, b)
		}
		t.Logf("PATCH per_user_limit 2, phone max 4: %d", code)
	})
	rep, rec := st.settle(s.ID, accepted)
	if rep.Sold <= 2000 {
		t.Errorf("sold %d: no purchase used the raised limits (the phones alone allowed 2000 before)", rep.Sold)
	}
	record(t, "patch limits during a flood", requests, accepted, rep, rec)
}

// splitMasterLost: a sale split over 12 buckets on a Redis Cluster (on
// either shape: the split needs masters to spread over), 6,000 units, 2 a
// buyer. Mid-flood a transaction holds the sale's MySQL row, so that the
// admitted orders wait in the stream (in flight: admitted in Redis, not yet
// written), and a master restarts without its data, its replica held from
// taking over: the one holding the sale's meta (meta true), or one holding
// only buckets. Buyers whose purchase failed retry with their
// Idempotency-Key, and every buyer answered 202 asks again with it while the
// orders are still in flight: one key, one order (the limit of 2 would let a
// second through). The row is let go and new buyers come at once (a
// rebuild that over-counts the stock shows as 202s MySQL's guard fails);
// once the sale settled, more new buyers buy every unit left: none is
// stranded for good, none sold twice.
func splitMasterLost(t *testing.T, meta bool) {
	name := "12 buckets: a bucket's master lost"
	if meta {
		name = "12 buckets: meta's master lost"
	}
	st := newStackWith(t, stackOpts{redisCluster: true})
	const total = 6000
	s := st.createBucketed(total, 2, 12)
	rc := testenv.Redis(t, st.cfg.Redis.Addrs)
	tags, err := lua.BucketTagsOf(context.Background(), rc, s.ID)
	if err != nil || len(tags) != 12 {
		t.Fatalf("bucket tags of %s: %v %v", s.ID, tags, err)
	}
	metaMaster := st.redisOf(s.ID)
	victim := metaMaster
	if !meta {
		victim = nil
		for _, sfx := range tags {
			m := st.rcluster.MasterOf(lua.BucketTag(s.ID, sfx))
			if m != nil && m != metaMaster {
				victim = m
				break
			}
		}
		if victim == nil {
			t.Fatalf("every bucket of %s is on the meta's master %s", s.ID, metaMaster.Addr)
		}
	}
	buckets := 0
	for _, sfx := range tags {
		if st.rcluster.MasterOf(lua.BucketTag(s.ID, sfx)) == victim {
			buckets++
		}
	}
	root, err := sql.Open("mysql", st.cfg.MySQL.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	var holder *sql.Tx
	groups := st.buyers(3000, true)
	requests := st.keyedFlood(s.ID, groups, 50, func() {
		if holder, err = root.BeginTx(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		var id string
		if err := holder.QueryRow(`SELECT id FROM sales WHERE id = ? FOR UPDATE`, s.ID).Scan(&id); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		st.holdShard(victim)
		t.Logf("killing master %s (meta's: %t, %d of 12 buckets) with orders in flight", victim.Addr, victim == metaMaster, buckets)
		victim.Kill()
		time.Sleep(500 * time.Millisecond)
		victim.Start()
		st.redisBack()
	})
	requests += st.replayAccepted(s.ID, groups)
	var waiting int64
	if err := root.QueryRow(`SELECT COUNT(*) FROM orders WHERE sale_id = ?`, s.ID).Scan(&waiting); err == nil {
		t.Logf("replays done with %d of %d accepted orders in MySQL: the rest in flight", waiting, len(acceptedOf(groups)))
	}
	if err := holder.Rollback(); err != nil {
		t.Fatal(err)
	}
	// New buyers at once, before any reconcile repairs the stock while the
	// sale is quiet: what the rebuild decided is what they meet.
	accepted := acceptedOf(groups)
	more, later := st.flood(s.ID, 8000, 8000, nil)
	requests += more
	accepted = append(accepted, later...)
	rep, _ := st.settle(s.ID, accepted)
	t.Logf("right after the loss %d more accepted; sold %d, %d left in Redis until the repair", len(later), rep.Sold, rep.RedisRemaining)
	// A lost bucket comes back with no stock until the repair of a quiet
	// sale gives its units back (docs/buckets.md): once settled, more new
	// buyers buy every unit left.
	more, later = st.flood(s.ID, 8000, 8000, nil)
	requests += more
	accepted = append(accepted, later...)
	rep, rec := st.settle(s.ID, accepted)
	if rep.Sold != total || rep.RedisRemaining != 0 {
		t.Errorf("sold %d of %d, %d left in Redis, after 16000 more buyers: units stranded or lost", rep.Sold, total, rep.RedisRemaining)
	}
	record(t, name, requests, accepted, rep, rec)
}

// replayAccepted has every buyer answered 202 ask once more with their key
// (retrying a 503, at most 50 times), and returns the requests sent.
func (st *stack) replayAccepted(sale string, groups [][]*buyer) int64 {
	var sent atomic.Int64
	for i, g := range groups {
		each(32, len(g), func(j int) {
			b := g[j]
			if b.accepted() == 0 {
				return
			}
			for range 50 {
				a := st.buy(st.gateways[i].addr, sale, b)
				sent.Add(1)
				b.answers = append(b.answers, a)
				if a.status != 503 && a.status != 0 {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	return sent.Load()
}

// each calls fn(0) … fn(n-1) from workers goroutines, and returns once all
// have returned.
func each(workers, n int, fn func(i int)) {
	var wg sync.WaitGroup
	var next atomic.Int64
	for range workers {
		wg.Go(func() {
			for {
				j := int(next.Add(1) - 1)
				if j >= n {
					return
				}
				fn(j)
			}
		})
	}
	wg.Wait()
}

// waitWarm waits (bounded) until Redis holds the sale's meta again: a
// backend warmed it (the leader's periodic pass, or a gateway's request).
// It calls nothing itself: an operator's reconcile would repair the stock on
// the way.
func (st *stack) waitWarm(sale string) {
	st.t.Helper()
	rc := testenv.Redis(st.t, st.cfg.Redis.Addrs)
	deadline := time.Now().Add(60 * time.Second)
	for {
		n, err := rc.Do(context.Background(), rc.B().Exists().Key(saleKey(sale)).Build()).AsInt64()
		if err == nil && n == 1 {
			return
		}
		if time.Now().After(deadline) {
			st.t.Fatalf("sale %s not warm again within 60s: %v", sale, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
