package chaos

import (
	"testing"
	"time"
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
	)
}
