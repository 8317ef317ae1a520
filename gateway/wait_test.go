package gateway

import (
	"testing"
	"time"

	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
)

// TestWaitReplicas: with redis.wait_replicas 1 a purchase on the stack's
// Cluster (a replica behind every master) is admitted once the replica has
// it; on the standalone Redis, which has no replica, the buyer gets 503 and
// the units come back (the admission is undone), so nothing was promised.
func TestWaitReplicas(t *testing.T) {
	wait := func(c *config.Config) { c.Redis.WaitReplicas, c.Redis.WaitTimeout = 1, 50*time.Millisecond }

	cl := start(t, wait, func(c *config.Config) { c.Redis.Addrs = testenv.ClusterAddrs() })
	s := cl.sale(nil)
	if r := cl.buy(s, cl.token("alice"), `{}`, nil); r.Status != 202 {
		t.Fatalf("purchase on the Cluster with wait_replicas 1: %d %s", r.Status, r.Raw)
	}
	if rem, resv := cl.stock(s); rem != s.Total-1 || resv != 1 {
		t.Fatalf("after the 202: remaining %d, %d reservations; want %d, 1", rem, resv, s.Total-1)
	}

	st := start(t, wait)
	s = st.sale(nil)
	r := st.buy(s, st.token("bob"), `{}`, nil)
	if r.Status != 503 || r.Code != "unavailable" {
		t.Fatalf("purchase on a Redis without replicas with wait_replicas 1: %d %s, want 503 unavailable", r.Status, r.Raw)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		rem, resv := st.stock(s)
		if rem == s.Total && resv == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the unreplicated admission was not undone: remaining %d, %d reservations", rem, resv)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
