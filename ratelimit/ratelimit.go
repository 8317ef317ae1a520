// Package ratelimit holds the gateway's local rate limits (docs/design.md §9): token
// buckets per client IP, per user and per sale, which operations retune while a
// sale runs.
//
// A bucket is kept as GCRA (the generic cell rate algorithm): one int64, the
// "theoretical arrival time" (TAT) of the next request. A key whose TAT is in
// the past has a full bucket, exactly like a key never seen, so it can be
// dropped at any moment without changing any answer. That is what keeps a flood
// of a million distinct IPs bounded: idle keys are swept, and a shard that is
// still full refuses new keys rather than grow (fail closed).
package ratelimit

import (
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashgate/flashgate/config"
)

const shardCount = 64

// Keyed is a set of token buckets, one per key, all with the same rate. It is
// safe for concurrent use and does not allocate once a key exists.
type Keyed struct {
	p       atomic.Pointer[params]
	maxKeys int // per shard
	shards  [shardCount]shard
}

type params struct {
	interval  int64 // ns between two requests at the steady rate
	tolerance int64 // interval × burst: how far the TAT may run ahead of now
}

type shard struct {
	mu        sync.Mutex
	tat       map[uint64]int64
	peak      int   // largest len(tat) since the map was last rebuilt
	lastSweep int64 // ns; a full shard sweeps at most every fullSweepEvery
	_         [32]byte
}

// fullSweepEvery bounds the sweeps a flood of new keys can force on a full
// shard: a sweep walks the whole shard, so one per request would be a lever.
const fullSweepEvery = int64(100 * time.Millisecond)

// NewKeyed returns buckets with rate r that track at most maxKeys keys.
func NewKeyed(r config.Rate, maxKeys int) *Keyed {
	k := &Keyed{maxKeys: max(1, (maxKeys+shardCount-1)/shardCount)}
	for i := range k.shards {
		k.shards[i].tat = make(map[uint64]int64)
	}
	k.SetRate(r)
	return k
}

// SetRate changes the rate of every bucket, live: each key's next request is
// judged by the new rate against the state it has.
func (k *Keyed) SetRate(r config.Rate) {
	if r.Rate <= 0 {
		k.p.Store(nil)
		return
	}
	interval := int64(math.Max(1, float64(time.Second)/r.Rate))
	k.p.Store(&params{interval: interval, tolerance: interval * int64(max(1, r.Burst))})
}

// Params are the limit's GCRA parameters: the time between two requests at
// the steady rate, and how far a key may run ahead (interval × burst); on is
// false when the limit is off. The fleet-wide limits (ratelimit.mode: global)
// run the same algorithm in Redis with them.
func (k *Keyed) Params() (interval, tolerance time.Duration, on bool) {
	p := k.p.Load()
	if p == nil {
		return 0, 0, false
	}
	return time.Duration(p.interval), time.Duration(p.tolerance), true
}

// Allow takes one token from key's bucket at time now (unix ns). When it
// refuses, wait is how long until a token is there.
func (k *Keyed) Allow(key uint64, now int64) (ok bool, wait time.Duration) {
	p := k.p.Load()
	if p == nil {
		return true, 0
	}
	s := &k.shards[key%shardCount]
	s.mu.Lock()
	tat, seen := s.tat[key]
	if !seen && len(s.tat) >= k.maxKeys {
		if now-s.lastSweep >= fullSweepEvery {
			s.sweep(now)
		}
		if len(s.tat) >= k.maxKeys {
			s.mu.Unlock()
			return false, time.Duration(p.interval)
		}
	}
	// After a retune a key may owe more than a whole bucket of the new rate; it
	// owes one empty bucket from now on, so the new rate is in force at once.
	// (A stored TAT never runs further ahead than that under one rate.)
	if tat > now+p.tolerance {
		tat = now + p.tolerance
		s.tat[key] = tat
	}
	next := max(tat, now) + p.interval
	if next-now > p.tolerance {
		s.mu.Unlock()
		return false, time.Duration(next - now - p.tolerance)
	}
	s.tat[key] = next
	if n := len(s.tat); n > s.peak {
		s.peak = n
	}
	s.mu.Unlock()
	return true, 0
}

// Sweep drops every idle key (full bucket) and returns how many keys remain.
// The owner calls it periodically; Allow also sweeps a full shard.
func (k *Keyed) Sweep(now int64) int {
	n := 0
	for i := range k.shards {
		s := &k.shards[i]
		s.mu.Lock()
		s.sweep(now)
		n += len(s.tat)
		s.mu.Unlock()
	}
	return n
}

func (s *shard) sweep(now int64) {
	s.lastSweep = now
	for key, tat := range s.tat {
		if tat <= now {
			delete(s.tat, key)
		}
	}
	// Go maps never give memory back; after a flood, start a small one.
	if s.peak > 4096 && len(s.tat) < s.peak/4 {
		m := make(map[uint64]int64, len(s.tat))
		for key, tat := range s.tat {
			m[key] = tat
		}
		s.tat, s.peak = m, len(m)
	}
}

// Len is the number of keys held.
func (k *Keyed) Len() int {
	n := 0
	for i := range k.shards {
		s := &k.shards[i]
		s.mu.Lock()
		n += len(s.tat)
		s.mu.Unlock()
	}
	return n
}

var seed = maphash.MakeSeed()

// KeyBytes hashes a key given as bytes (a user id) without allocating.
func KeyBytes(b []byte) uint64 { return maphash.Bytes(seed, b) }

// KeyString hashes a key given as a string (a sale id).
func KeyString(s string) uint64 { return maphash.String(seed, s) }
