package ratelimit

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashgate/flashgate/config"
)

const sec = int64(time.Second)

func TestBurstThenRate(t *testing.T) {
	k := NewKeyed(config.Rate{Rate: 10, Burst: 5}, 100)
	now := int64(1e18)
	for i := 0; i < 5; i++ {
		if ok, _ := k.Allow(1, now); !ok {
			t.Fatalf("request %d of the burst refused", i)
		}
	}
	ok, wait := k.Allow(1, now)
	if ok || wait <= 0 || wait > 100*time.Millisecond {
		t.Fatalf("6th at once: ok=%v wait=%v, want refused with wait ≤ 100ms", ok, wait)
	}
	// Another key has its own bucket.
	if ok, _ := k.Allow(2, now); !ok {
		t.Fatal("another key refused")
	}
	// After the wait, exactly one more.
	now += int64(wait)
	if ok, _ := k.Allow(1, now); !ok {
		t.Fatal("refused after waiting the advised time")
	}
	if ok, _ := k.Allow(1, now); ok {
		t.Fatal("two allowed after one interval")
	}
	// Over 10 s at 10/s from a drained bucket: 100 more, give or take one.
	n := 0
	for ts := now; ts < now+10*sec; ts += sec / 1000 {
		if ok, _ := k.Allow(1, ts); ok {
			n++
		}
	}
	if n < 99 || n > 101 {
		t.Fatalf("%d allowed in 10 s at 10/s", n)
	}
}

func TestOffAndLiveRetune(t *testing.T) {
	k := NewKeyed(config.Rate{}, 10)
	now := int64(1e18)
	for i := 0; i < 1000; i++ {
		if ok, _ := k.Allow(7, now); !ok {
			t.Fatal("a limit with rate 0 refused")
		}
	}
	if k.Len() != 0 {
		t.Fatalf("an off limit holds %d keys", k.Len())
	}
	k.SetRate(config.Rate{Rate: 1, Burst: 1})
	if ok, _ := k.Allow(7, now); !ok {
		t.Fatal("first request after turning the limit on")
	}
	if ok, _ := k.Allow(7, now); ok {
		t.Fatal("second request at 1/s burst 1")
	}
	// Loosened to 1000/s: the key's debt at 1/s does not carry over, so over the
	// next 100 ms about 100 pass (at 1/s, none would).
	k.SetRate(config.Rate{Rate: 1000, Burst: 1})
	n := 0
	for ts := now; ts < now+sec/10; ts += sec / 10000 {
		if ok, _ := k.Allow(7, ts); ok {
			n++
		}
	}
	if n < 98 || n > 101 {
		t.Fatalf("%d allowed in 100 ms after raising the rate to 1000/s", n)
	}
}

func TestIdleKeysAreDroppedLosslessly(t *testing.T) {
	k := NewKeyed(config.Rate{Rate: 100, Burst: 2}, 1000)
	now := int64(1e18)
	for key := uint64(0); key < 500; key++ {
		k.Allow(key, now)
	}
	if k.Len() != 500 {
		t.Fatalf("%d keys, want 500", k.Len())
	}
	if left := k.Sweep(now + sec); left != 0 {
		t.Fatalf("%d keys left after they went idle", left)
	}
	// A key still inside its window survives a sweep and keeps its state.
	k.Allow(1, now)
	k.Allow(1, now)
	if k.Sweep(now) != 1 {
		t.Fatal("a busy key was swept")
	}
	if ok, _ := k.Allow(1, now); ok {
		t.Fatal("a busy key lost its state in a sweep")
	}
}

func TestFullShardRefusesNewKeysButNotKnownOnes(t *testing.T) {
	k := NewKeyed(config.Rate{Rate: 1, Burst: 10}, shardCount) // one key per shard
	now := int64(1e18)
	if ok, _ := k.Allow(0, now); !ok {
		t.Fatal("first key refused")
	}
	if ok, _ := k.Allow(shardCount, now); ok { // same shard, new key, shard full of a busy key
		t.Fatal("a full shard grew")
	}
	if ok, _ := k.Allow(0, now); !ok {
		t.Fatal("a known key refused because its shard is full")
	}
	// Once the busy key idles, the new key gets in.
	if ok, _ := k.Allow(shardCount, now+20*sec); !ok {
		t.Fatal("new key refused after the shard's keys went idle")
	}
}

// TestMillionKeysStayBounded floods one limiter with 1,000,000 distinct keys,
// as 1,000,000 distinct IPs would, and reports what it costs.
func TestMillionKeysStayBounded(t *testing.T) {
	for _, max := range []int{100_000, 1_000_000} {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		k := NewKeyed(config.Rate{Rate: 20, Burst: 40}, max)
		now := int64(1e18)
		refused := 0
		for key := uint64(0); key < 1_000_000; key++ {
			if ok, _ := k.Allow(KeyString(string(rune(key))+"x")^key, now); !ok {
				refused++
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		held := k.Len()
		if held > max+shardCount {
			t.Fatalf("max %d: holds %d keys", max, held)
		}
		if max < 1_000_000 && refused == 0 {
			t.Fatalf("max %d: a full limiter took every new key", max)
		}
		grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
		t.Logf("max_keys %d: 1,000,000 distinct keys → %d held, %d refused (table full), heap +%.1f MB (%.0f B/key)",
			max, held, refused, float64(grew)/1e6, float64(grew)/float64(held))
		// Once idle, everything goes, and the maps shrink again.
		if left := k.Sweep(now + 10*sec); left != 0 {
			t.Fatalf("%d keys left after idling", left)
		}
		runtime.GC()
		var swept runtime.MemStats
		runtime.ReadMemStats(&swept)
		t.Logf("max_keys %d: after the sweep heap is +%.1f MB over the start", max, float64(int64(swept.HeapAlloc)-int64(before.HeapAlloc))/1e6)
		runtime.KeepAlive(k)
	}
}

func TestAllowDoesNotAllocate(t *testing.T) {
	k := NewKeyed(config.Rate{Rate: 1e6, Burst: 1e6}, 1000)
	user := []byte("user-42")
	now := int64(1e18)
	k.Allow(KeyBytes(user), now)
	if n := testing.AllocsPerRun(1000, func() { k.Allow(KeyBytes(user), now) }); n != 0 {
		t.Fatalf("Allow allocates %v times", n)
	}
}

func TestConcurrentAllowCountsEveryToken(t *testing.T) {
	k := NewKeyed(config.Rate{Rate: 1, Burst: 1000}, 100)
	now := int64(1e18)
	var ok atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				if a, _ := k.Allow(9, now); a {
					ok.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 1000 {
		t.Fatalf("%d allowed from a burst of 1000", ok.Load())
	}
}

func TestLimitsApplyKeepsOldOnInvalid(t *testing.T) {
	cfg := config.Default().RateLimit
	l := New(cfg, 100, "test")
	bad := cfg
	bad.PerUser.Rate = -1
	if err := l.Apply(bad, "test"); err == nil {
		t.Fatal("an invalid reload was applied")
	}
	v := l.View()
	if v.Limits != cfg || v.LastError == "" || v.LastErrorAt == nil {
		t.Fatalf("after a refused reload: %+v", v)
	}
	good := cfg
	good.MaxInflight = 1
	if err := l.Apply(good, "test"); err != nil {
		t.Fatal(err)
	}
	if !l.Enter() || l.Enter() {
		t.Fatal("max_inflight 1 not enforced")
	}
	l.Leave()
	if !l.Enter() {
		t.Fatal("a slot was not given back")
	}
	if v := l.View(); v.LastError != "" || v.Limits.MaxInflight != 1 {
		t.Fatalf("after a good reload: %+v", v)
	}
}

func BenchmarkAllow(b *testing.B) {
	k := NewKeyed(config.Rate{Rate: 1e9, Burst: 1e9}, 1_000_000)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		key := uint64(time.Now().UnixNano())
		for pb.Next() {
			k.Allow(key, time.Now().UnixNano())
			key++
		}
	})
}
