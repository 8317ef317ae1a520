package chaos

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
	"github.com/redis/rueidis"
)

// The scenarios on a sale split over stock buckets (docs/buckets.md): on the
// suite's single Redis the twelve buckets share it, on a Redis Cluster they
// spread over its masters, and every path of a split sale runs (homes,
// transfers, warm and reconcile per bucket).
func init() {
	scenarios = append(scenarios,
		scenario{"12 buckets: redis lost + gw kill", func(t *testing.T) {
			st := newStack(t)
			s := st.createBucketed(2000, 1, 12)
			// Redis loses everything mid-flood (the warm rebuilds every
			// bucket from MySQL and the stream), and a gateway dies and comes
			// back (transfers it had under way are landed by reconcile).
			requests, accepted := st.flood(s.ID, 3000, 3000, func() {
				st.loseAllRedis(500 * time.Millisecond)
				time.Sleep(300 * time.Millisecond)
				st.gateways[1].kill()
				time.Sleep(200 * time.Millisecond)
				st.gateways[1].start()
			})
			if rep, _ := st.settle(s.ID, accepted); !rep.OK() {
				t.Fatalf("after the faults: %s", rep)
			}
			// New buyers then buy what is left: every unit sells, none is
			// stranded in a bucket.
			more, acc2 := st.flood(s.ID, 6000, 6000, nil)
			accepted = append(accepted, acc2...)
			rep, rec := st.settle(s.ID, accepted)
			if rep.Sold != 2000 || rep.RedisRemaining != 0 {
				t.Errorf("sold %d of 2000, %d left in Redis, after %d more buyers: units stranded", rep.Sold, rep.RedisRemaining, 6000)
			}
			record(t, "12 buckets: redis lost + gw kill", requests+more, accepted, rep, rec)
		}},
		scenario{"12 buckets: phone limit, faults", phoneLimitFaults},
	)
}

// Phone limit of the phone scenario: at most phoneMax units per phone, over
// the sale.
const phoneMax = 2

// phoneLimitFaults floods a split sale limited by phone with buyers who share
// phones (six users a phone, with homes in every bucket), so that most
// purchases hold their phone's charge in another bucket than their home
// before their admission (docs/buckets.md). Redis loses everything in a first
// flood (the warm rebuilds every phone's counter and held charge); a gateway
// is killed -9 in a second, with purchases between their hold and its keep
// or give-back, which leaves those holds for reconcile (lua.FinishHolds,
// past lua.HoldGrace). No phone may end beyond its limit, by the audit and by
// the test's own count per phone; Redis's phone counters must come back to
// what MySQL's live orders charge; and new buyers on new phones then buy
// every unit left.
//
// The two faults are in two floods because a flood outlives neither: during
// Redis's loss and until the warm, each gateway answers 503 at once, and the
// flood's requests run out before the sale admits again.
func phoneLimitFaults(t *testing.T) {
	st := newStack(t)
	limits := []flashgate.Limit{{Dimension: flashgate.DimPhone, Max: phoneMax}}
	// Each faulty flood: 6,000 users over 1,000 phones, at most 2,000 units.
	const total, users, phones = 6000, 6000, 1000
	s := st.createLimited(total, 1, 12, limits)
	check := func(when string, accepted []uint64) {
		t.Helper()
		rep, _ := st.settle(s.ID, accepted)
		if !rep.OK() {
			t.Fatalf("%s: %s", when, rep)
		}
		units, atMax := st.phoneUnits(s.ID)
		t.Logf("%s: %d units sold to %d phones, %d of them at the limit of %d", when, rep.Sold, len(units), atMax, phoneMax)
		if atMax == 0 {
			t.Errorf("%s: no phone reached its limit of %d: the buyers did not contend for phones", when, phoneMax)
		}
	}
	start := time.Now()
	requests, accepted := st.floodPhones(s.ID, users, users, phones, func() {
		st.loseAllRedis(500 * time.Millisecond)
	})
	t.Logf("flood 1 (redis lost): %d requests, %d accepted in %v", requests, len(accepted), time.Since(start).Round(time.Millisecond))
	check("after redis lost", accepted)

	start = time.Now()
	more, acc := st.floodPhones(s.ID, users, users, phones, func() {
		st.gateways[1].kill()
		time.Sleep(200 * time.Millisecond)
		st.gateways[1].start()
	})
	requests, accepted = requests+more, append(accepted, acc...)
	t.Logf("flood 2 (gateway-1 killed): %d requests, %d accepted in %v; %d holds left undecided", more, len(acc),
		time.Since(start).Round(time.Millisecond), st.holdsLeft(s.ID))
	check("after gateway-1 killed", accepted)

	// New buyers on new phones, two a phone, then buy what is left: every
	// unit sells, none is stranded in a bucket.
	more, acc = st.floodPhones(s.ID, users, users, users/2, nil)
	requests, accepted = requests+more, append(accepted, acc...)
	rep, rec := st.settle(s.ID, accepted)
	if rep.Sold != total || rep.RedisRemaining != 0 {
		t.Errorf("sold %d of %d, %d left in Redis, after %d more buyers: units stranded", rep.Sold, total, rep.RedisRemaining, users)
	}
	units, atMax := st.phoneUnits(s.ID)
	t.Logf("at the end: %d units sold to %d phones, %d of them at the limit", rep.Sold, len(units), atMax)
	// And no hold stays undecided, nor counts in Redis beyond MySQL.
	// Nor less than MySQL's: that phone's next buyer would get a 202 that
	// MySQL's guard then fails (the warm restores what is in flight, charges
	// included).
	if below := st.phoneCountersAgree(s.ID, units); len(below) != 0 {
		t.Errorf("phones whose counter in Redis reads less than MySQL's, by flood: %v", below)
	}
	if b, err := os.ReadFile(st.backend.log); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "finished purchase-limit holds left half done") {
				t.Logf("backend: %s", line)
			}
		}
	}
	record(t, "12 buckets: phone limit, faults", requests, accepted, rep, rec)
}

// phoneUnits counts the live units of sale per phone from MySQL's orders,
// through the phones the test gave its users (st.phoneOf), not through the
// charges the audit reads; it fails the test for a phone beyond phoneMax, and
// for a live order whose charges do not count its units against its buyer's
// phone (what the audit's over_limit_subjects would then miss). atMax is the
// number of phones at the limit.
func (st *stack) phoneUnits(sale string) (units map[string]int64, atMax int) {
	st.t.Helper()
	db, err := mysql.OpenDB(st.cfg.MySQL.DSN)
	if err != nil {
		st.t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.QueryContext(context.Background(), `SELECT user_id, quantity, charges FROM orders
		WHERE sale_id = ? AND status IN (?, ?)`, sale, flashgate.OrderConfirmed, flashgate.OrderPaid)
	if err != nil {
		st.t.Fatal(err)
	}
	defer rows.Close()
	units = map[string]int64{}
	for rows.Next() {
		var user, enc string
		var qty int64
		if err := rows.Scan(&user, &qty, &enc); err != nil {
			st.t.Fatal(err)
		}
		phone, ok := st.phoneOf[user]
		if !ok {
			st.t.Fatalf("live order of %s, a user the test never minted a phone for", user)
		}
		units[phone] += qty
		cs, err := flashgate.ParseCharges(enc)
		if err != nil || len(cs) != 1 || cs[0].Limit != 0 || cs[0].Subject != phone || cs[0].Inc != qty || cs[0].Window != flashgate.PerSale {
			st.t.Errorf("order of %s (phone %s, %d units) charges %q (%v): not its phone's", user, phone, qty, enc, err)
		}
	}
	if err := rows.Err(); err != nil {
		st.t.Fatal(err)
	}
	for phone, n := range units {
		if n > phoneMax {
			st.t.Errorf("phone %s bought %d units, limit %d", phone, n, phoneMax)
		}
		if n == phoneMax {
			atMax++
		}
	}
	return units, atMax
}

// phoneCountersAgree waits until reconcile decided every hold of the sale
// (lua.FinishHolds, past lua.HoldGrace) and no phone's counter in Redis (in
// its bucket, lua.LimitBucket) reads more than MySQL's live orders charge it
// (units): a hold a killed gateway left undecided counts in Redis until
// then, and a counter above MySQL's would refuse that phone's buyers for
// nothing. It returns the phones whose counter reads less, by the flood
// that gave them (their phone's series), then: see the scenario.
func (st *stack) phoneCountersAgree(sale string, units map[string]int64) (below map[string]int) {
	st.t.Helper()
	ctx := context.Background()
	rc := testenv.Redis(st.t, st.cfg.Redis.Addrs)
	phones := map[string]bool{}
	for _, p := range st.phoneOf {
		phones[p] = true
	}
	began := time.Now()
	deadline := began.Add(lua.HoldGrace + 30*time.Second)
	for {
		tags, err := lua.BucketTagsOf(ctx, rc, sale)
		if err != nil {
			st.t.Fatal(err)
		}
		k := lua.BucketedKeysFor(sale, nil, tags)
		if len(k.Buckets()) != 12 {
			st.t.Fatalf("sale %s has %d buckets in Redis, want 12", sale, len(k.Buckets()))
		}
		var above []string
		below = map[string]int{}
		for phone := range phones {
			b := k.Buckets()[lua.LimitBucket(phone, len(k.Buckets()))]
			field := flashgate.Charge{Limit: 0, Subject: phone}.Field()
			n, err := rc.Do(ctx, rc.B().Hget().Key(b.Limit(flashgate.PerSale)).Field(field).Build()).AsInt64()
			if err != nil && !rueidis.IsRedisNil(err) {
				st.t.Fatal(err)
			}
			switch {
			case n > units[phone]:
				above = append(above, phone+": redis "+strconv.FormatInt(n, 10)+", mysql "+strconv.FormatInt(units[phone], 10))
			case n < units[phone]:
				below["flood "+phone[5:7]]++
			}
		}
		held := st.holdsLeft(sale)
		if len(above) == 0 && held == 0 {
			st.t.Logf("every hold decided, no phone counter above MySQL's, after %v more", time.Since(began).Round(100*time.Millisecond))
			return below
		}
		if time.Now().After(deadline) {
			if held != 0 {
				st.t.Errorf("%d purchase-limit holds still undecided %v after the faults", held, lua.HoldGrace+30*time.Second)
			}
			if len(above) != 0 {
				st.t.Errorf("%d phone counters in Redis above MySQL's %v after the faults, e.g. %s", len(above), lua.HoldGrace+30*time.Second, above[0])
			}
			return below
		}
		st.admin("POST", "/admin/v1/sales/"+sale+"/reconcile?older_than=2s", nil)
		time.Sleep(time.Second)
	}
}

// holdsLeft counts the purchase-limit holds of sale not yet decided, over its
// buckets (lua.Keys.Holds).
func (st *stack) holdsLeft(sale string) int64 {
	st.t.Helper()
	ctx := context.Background()
	rc := testenv.Redis(st.t, st.cfg.Redis.Addrs)
	tags, err := lua.BucketTagsOf(ctx, rc, sale)
	if err != nil {
		st.t.Fatal(err)
	}
	var n int64
	for _, b := range lua.BucketedKeysFor(sale, nil, tags).Buckets() {
		c, err := rc.Do(ctx, rc.B().Hlen().Key(b.Holds()).Build()).AsInt64()
		if err != nil {
			st.t.Fatal(err)
		}
		n += c
	}
	return n
}
