package gateway

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"github.com/sony/gobreaker/v2"

	"github.com/flashgate/flashgate/metrics"
)

// breakers are the circuit breakers around the gateway's dependencies: one per
// Redis shard (every key of a sale lives on the shard that owns its hash slot)
// and one around the JetStream publish. An open breaker answers 503 at once
// without touching its dependency; after cfg.BreakerOpen it lets probes
// through, and their success closes it again by itself.
type breakers struct {
	newBreaker func(name string) *breaker
	redis      atomic.Pointer[map[string]*breaker]
	mu         sync.Mutex // serialises redis map writers
	slots      atomic.Pointer[[]slotRange]
	nats       *breaker
}

// breaker is a circuit breaker that knows when it will let probes through
// again: a 503 it causes tells the buyer to come back about then
// (Retry-After, unavailableFor), rather than every buyer in the next second.
type breaker struct {
	*gobreaker.CircuitBreaker[struct{}]
	openUntil atomic.Int64 // unix ns: when the last opening ends
}

// retryIn is how long the breaker stays open from now (0 unless it is open).
func (b *breaker) retryIn(now time.Time) time.Duration {
	if b.State() != gobreaker.StateOpen {
		return 0
	}
	return max(time.Duration(b.openUntil.Load()-now.UnixNano()), 0)
}

// standalone names the one shard of a Redis that is not a cluster.
const standalone = "redis"

type slotRange struct {
	start, end uint16
	addr       string
}

func newBreakers(failures int, open time.Duration, m *metrics.Gateway) *breakers {
	b := &breakers{}
	b.newBreaker = func(name string) *breaker {
		br := &breaker{}
		br.CircuitBreaker = gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
			Name:        name,
			MaxRequests: 3, // half-open probes
			Timeout:     open,
			ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= uint32(failures) },
			// Only a dependency that did not answer is a failure: a script's
			// own error reply means Redis is there.
			IsSuccessful: func(err error) bool { return err == nil || isReply(err) },
			OnStateChange: func(name string, from, to gobreaker.State) {
				if to == gobreaker.StateOpen {
					br.openUntil.Store(time.Now().Add(open).UnixNano())
				}
				slog.Warn("circuit breaker", "breaker", name, "from", from.String(), "to", to.String())
				m.BreakerState(name, breakerGauge(to))
			},
		})
		return br
	}
	b.nats = b.newBreaker("nats")
	m.BreakerState("nats", metrics.BreakerClosed)
	empty := map[string]*breaker{}
	b.redis.Store(&empty)
	return b
}

func breakerGauge(s gobreaker.State) int {
	switch s {
	case gobreaker.StateOpen:
		return metrics.BreakerOpen
	case gobreaker.StateHalfOpen:
		return metrics.BreakerHalfOpen
	}
	return metrics.BreakerClosed
}

func isReply(err error) bool {
	var re *rueidis.RedisError
	if !errors.As(err, &re) {
		return false
	}
	_, moved := re.IsMoved()
	_, ask := re.IsAsk()
	return !moved && !ask && !re.IsTryAgain() && !re.IsClusterDown()
}

func refusedByBreaker(err error) bool {
	return errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests)
}

// forSlot is the breaker of the shard that owns slot. It does not allocate once
// the shard has a breaker.
func (b *breakers) forSlot(slot uint16) *breaker {
	addr := standalone
	if r := b.slots.Load(); r != nil {
		rs := *r
		i := sort.Search(len(rs), func(i int) bool { return rs[i].end >= slot })
		if i < len(rs) && rs[i].start <= slot {
			addr = rs[i].addr
		}
	}
	if cb := (*b.redis.Load())[addr]; cb != nil {
		return cb
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	m := *b.redis.Load()
	if cb := m[addr]; cb != nil {
		return cb
	}
	name := "redis " + addr
	if addr == standalone {
		name = standalone
	}
	cb := b.newBreaker(name)
	m = maps.Clone(m)
	m[addr] = cb
	b.redis.Store(&m)
	return cb
}

// refreshSlots reads the cluster's slot map; a standalone Redis has none.
func (b *breakers) refreshSlots(ctx context.Context, rc rueidis.Client) {
	res, err := rc.Do(ctx, rc.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		if isReply(err) { // "cluster support disabled": one shard
			b.slots.Store(nil)
		}
		return
	}
	var rs []slotRange
	for _, e := range res {
		f, err := e.ToArray()
		if err != nil || len(f) < 3 {
			continue
		}
		start, _ := f[0].AsInt64()
		end, _ := f[1].AsInt64()
		node, _ := f[2].ToArray()
		if len(node) < 2 {
			continue
		}
		host, _ := node[0].ToString()
		port, _ := node[1].AsInt64()
		rs = append(rs, slotRange{start: uint16(start), end: uint16(end), addr: net.JoinHostPort(host, strconv.FormatInt(port, 10))})
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].start < rs[j].start })
	b.slots.Store(&rs)
}

// hashSlot is Redis Cluster's slot of a key whose hash tag is tag.
func hashSlot(tag string) uint16 { return crc16(tag) & 16383 }

// crc16 is CRC-16/XMODEM, the checksum Redis Cluster uses for slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for j := 0; j < 8; j++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
