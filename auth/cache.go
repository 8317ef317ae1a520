package auth

import (
	"fmt"
	"hash/maphash"
	"sync"
	"time"
)

// Cache remembers tokens the Verifier accepted, until they expire, so that a
// buyer retrying through a flood costs a map lookup instead of a signature check
// (and no allocation). An entry matches only if the whole token is equal, so a
// hash collision can never authenticate anyone. Refused tokens are not cached:
// garbage would only crowd real buyers out.
type Cache struct {
	v      *Verifier
	max    int // per shard
	shards [cacheShards]cacheShard
}

const cacheShards = 32

type cacheShard struct {
	mu sync.RWMutex
	m  map[uint64]*cached
	_  [40]byte
}

type cached struct {
	token  string
	claims *Claims
	exp    int64 // unix seconds: the token's exp
}

var cacheSeed = maphash.MakeSeed()

// errDenied is built once: a revoked token retrying costs no allocation.
var errDenied = fmt.Errorf("%w: %w", ErrUnauthorized, ErrDenied)

// NewCache wraps v with a cache of at most size tokens (size 0: no cache).
func NewCache(v *Verifier, size int) *Cache {
	c := &Cache{v: v, max: size / cacheShards}
	if size > 0 && c.max == 0 {
		c.max = 1
	}
	for i := range c.shards {
		c.shards[i].m = make(map[uint64]*cached)
	}
	return c
}

// Verify checks token at time now. The claims returned are shared: read only.
// A cached token is checked against the denylist on every call: revoking it
// takes effect here as soon as the gateway's copy of the list has it.
func (c *Cache) Verify(token []byte, now time.Time) (*Claims, error) {
	if c.max == 0 {
		return c.v.Verify(string(token))
	}
	h := maphash.Bytes(cacheSeed, token)
	s := &c.shards[h%cacheShards]
	s.mu.RLock()
	e := s.m[h]
	s.mu.RUnlock()
	if e != nil && e.token == string(token) && now.Unix() < e.exp {
		if c.v.deny.Denied(e.claims, now.Unix()) {
			return nil, errDenied
		}
		return e.claims, nil
	}
	claims, err := c.v.verify(string(token))
	if err != nil {
		return nil, err
	}
	if c.v.deny.Denied(claims, now.Unix()) {
		return nil, errDenied
	}
	// The cache keeps a token no longer than the verifier would accept it, and
	// of its claims only what requests read: a full Claims (audience slice,
	// issued-at and not-before dates) doubled an entry's size.
	slim := &Claims{Phone: claims.Phone, Device: claims.Device}
	slim.Subject, slim.ExpiresAt, slim.ID = claims.Subject, claims.ExpiresAt, claims.ID
	e = &cached{token: string(token), claims: slim, exp: claims.ExpiresAt.Add(expLeeway).Unix()}
	s.mu.Lock()
	if len(s.m) >= c.max {
		s.evict(now.Unix())
	}
	s.m[h] = e
	s.mu.Unlock()
	return slim, nil
}

// evict drops expired entries, or, when none has expired, an arbitrary tenth
// of the shard (map order is random): a bounded, cheap stand-in for LRU.
func (s *cacheShard) evict(now int64) {
	n := len(s.m)
	for h, e := range s.m {
		if now >= e.exp {
			delete(s.m, h)
		}
	}
	if len(s.m) < n {
		return
	}
	drop := max(1, n/10)
	for h := range s.m {
		delete(s.m, h)
		if drop--; drop == 0 {
			return
		}
	}
}

// Len is the number of cached tokens.
func (c *Cache) Len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		n += len(s.m)
		s.mu.RUnlock()
	}
	return n
}

// Denylist is the denylist every Verify checks.
func (c *Cache) Denylist() *Denylist { return c.v.deny }
