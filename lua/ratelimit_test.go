package lua_test

import (
	"testing"
	"time"

	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// TestRateAllowShared: a fleet-wide limit of burst 5 at one request a
// second lets 5 requests through across two clients of the Cluster, then
// refuses with a wait of about a second; the key expires once its bucket is
// full again.
func TestRateAllowShared(t *testing.T) {
	a := testenv.Redis(t, testenv.ClusterAddrs())
	b := testenv.Redis(t, testenv.ClusterAddrs())
	key := lua.RateKey("sale", testenv.ID("rl"))
	passed := 0
	for i := range 10 {
		c := a
		if i%2 == 1 {
			c = b
		}
		ok, wait, err := lua.RateAllow(ctx(t), c, key, time.Second, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			passed++
		} else if wait <= 0 || wait > time.Second {
			t.Fatalf("refused with wait %v", wait)
		}
	}
	if passed != 5 {
		t.Fatalf("%d passed, want the burst of 5", passed)
	}
	ttl, err := a.Do(ctx(t), a.B().Pttl().Key(key).Build()).AsInt64()
	if err != nil || ttl <= 0 || ttl > 5001 {
		t.Fatalf("pttl %d %v: want the time until the bucket is full", ttl, err)
	}
}
