package chaos

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/flashgate/flashgate/mysql"
)

// The scenarios that need the backend's recovery work: reconcile republishing
// reservations whose publish never happened, re-warming a Redis that lost its
// data, and the leader's expiry sweeper.
func init() {
	scenarios = append(scenarios,
		scenario{"gateway kill -9", func(t *testing.T) {
			st := newStack(t)
			s := st.createSale(2000, 1)
			requests, accepted := st.flood(s.ID, 3000, 3000, func() { st.gateways[1].kill() })
			rep, rec := st.settle(s.ID, accepted)
			record(t, "gateway kill -9", requests, accepted, rep, rec)
		}},
		scenario{"gateway dies admit→publish", func(t *testing.T) {
			st := newStack(t, nil, []string{"FLASHGATE_FAILPOINT_CRASH_AFTER_ADMITS=300"})
			s := st.createSale(2000, 1)
			requests, accepted := st.flood(s.ID, 3000, 3000, nil)
			if !st.gateways[1].exited(10 * time.Second) {
				t.Fatal("the failpoint did not fire")
			}
			rep, rec := st.settle(s.ID, accepted)
			// The reservation whose publish never happened became an order all
			// the same (its buyer got no answer): more orders than 202s.
			if rep.Orders <= int64(len(accepted)) {
				t.Errorf("%d orders for %d 202s: the stranded reservation was not republished", rep.Orders, len(accepted))
			}
			record(t, "gateway dies admit→publish", requests, accepted, rep, rec)
		}},
		scenario{"redis restart, data lost", func(t *testing.T) {
			st := newStack(t)
			s := st.createSale(2000, 1)
			// No persistence: everything in it is gone (on a cluster: the
			// sale's master, its replica kept from taking over, fleet_test.go).
			requests, accepted := st.flood(s.ID, 4000, 4000, func() { st.loseRedis(s.ID, 500*time.Millisecond) })
			rep, rec := st.settle(s.ID, accepted)
			record(t, "redis restart, data lost", requests, accepted, rep, rec)
		}},
		scenario{"payment timeout storm", func(t *testing.T) {
			const unpaid = 10000
			// Every process's: the backend sets an order's pay-by time itself
			// (it trusts no message's), so its own timeout is what expires them.
			st := newStackWith(t, stackOpts{env: []string{"FLASHGATE_ORDERS_PAYMENT_TIMEOUT=6s"}})
			s := st.createSale(unpaid+2000, 1)
			// 10,000 orders nobody pays; they all expire within a second or so.
			_, first := st.flood(s.ID, unpaid, unpaid, nil)
			db, err := mysql.OpenDB(st.cfg.MySQL.DSN)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			waitCount(t, db, s.ID, "status IN ('confirmed','paid','canceled')", int64(len(first)), 60*time.Second)
			// New buyers arrive while the storm expires them.
			var rate float64
			requests, later := st.flood(s.ID, 6000, 6000, func() {
				expired := "status = 'canceled' AND reason = 'expired'"
				waitCount(t, db, s.ID, expired, 1, 30*time.Second)
				start := time.Now()
				waitCount(t, db, s.ID, expired, int64(len(first)), 90*time.Second)
				rate = float64(len(first)) / time.Since(start).Seconds()
				st.faultEnd = time.Now() // the storm is over when the last one expired
			})
			accepted := append(first, later...)
			rep, rec := st.settle(s.ID, accepted)
			// The orders were made over a second or two, and expire as they were made.
			t.Logf("sweeper: %d expired orders, %.0f/s from the first expiry to the last", len(first), rate)
			if rep.ByStatus["canceled"] < int64(len(first)) {
				t.Errorf("only %d orders canceled of %d that expired", rep.ByStatus["canceled"], len(first))
			}
			if len(later) == 0 {
				t.Errorf("no purchase of the second wave went through while the first expired")
			}
			record(t, "payment timeout storm", requests+int64(unpaid), accepted, rep, rec)
		}},
	)
}

func waitCount(t *testing.T, db *sql.DB, sale, where string, n int64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var got int64
		ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
		err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM orders WHERE sale_id = ? AND "+where, sale).Scan(&got)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d orders with %s after %v, want %d", got, where, within, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
