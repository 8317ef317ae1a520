package ratelimit

import (
	"sync"
	"time"
)

// DenyCache remembers, for a short while, the keys a fleet-wide limit
// (ratelimit.mode: global, kept in Redis) has just refused: until the wait
// Redis advised has passed, the same key is refused from memory, so a flood
// over the limit costs Redis one call per key per wait, not one per request.
// It holds at most max keys; a full cache sweeps the expired ones and, if
// still full, remembers nothing new (the refusal then comes from Redis again).
type DenyCache struct {
	mu        sync.Mutex
	until     map[DenyKey]int64 // key → unix ns the refusal lasts to
	max       int
	lastSweep int64
}

// DenyKey names one limited subject: a kind of limit (the caller's numbering)
// and the subject's id. A struct, not a joined string, so that a refusal from
// memory allocates nothing.
type DenyKey struct {
	Kind uint8
	ID   string
}

// NewDenyCache returns a cache of at most max keys.
func NewDenyCache(max int) *DenyCache {
	return &DenyCache{until: make(map[DenyKey]int64), max: max}
}

// Denied reports whether key was refused and its wait has not passed at now
// (unix ns), and what is left of the wait.
func (d *DenyCache) Denied(key DenyKey, now int64) (bool, time.Duration) {
	d.mu.Lock()
	u, ok := d.until[key]
	if ok && u <= now {
		delete(d.until, key)
		ok = false
	}
	d.mu.Unlock()
	if !ok {
		return false, 0
	}
	return true, time.Duration(u - now)
}

// Deny remembers that key is refused until until (unix ns).
func (d *DenyCache) Deny(key DenyKey, now, until int64) {
	if until <= now {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.until[key]; !ok && len(d.until) >= d.max {
		if now-d.lastSweep < fullSweepEvery {
			return
		}
		d.sweep(now)
		if len(d.until) >= d.max {
			return
		}
	}
	d.until[key] = until
}

// Sweep drops the refusals that have run out and answers how many remain.
func (d *DenyCache) Sweep(now int64) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sweep(now)
	return len(d.until)
}

func (d *DenyCache) sweep(now int64) {
	d.lastSweep = now
	for k, u := range d.until {
		if u <= now {
			delete(d.until, k)
		}
	}
}
