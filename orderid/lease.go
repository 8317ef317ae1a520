package orderid

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate/lua"
)

// KeyPrefix names the lease keys (lua.NodeLease): KeyPrefix + "<n>".
const KeyPrefix = lua.NodeLeasePrefix

// LeasedNodes: node ids 0..LeasedNodes-1 are leased in Redis (gateways); the
// LaneNodes above them are the degraded lane's, leased in MySQL by the
// backends (docs/degrade.md), so that the lane makes ids while Redis is away.
const (
	LaneNodes   = 16
	LeasedNodes = MaxNode + 1 - LaneNodes
)

// ErrNoNode means every node id is leased by someone else.
var ErrNoNode = errors.New("orderid: no free node id")

// Lease is a node id held in Redis with SET NX and a TTL, renewed at a third
// of the TTL. If a renewal finds the key gone or taken, or Redis stays
// unreachable until the key is about to expire, the lease is lost: Lost is
// closed and the holder must stop making ids with this node (two gateways with
// one node id could make the same id).
type Lease struct {
	*Generator
	client rueidis.Client
	key    string
	token  string
	ttl    time.Duration
	lost   chan struct{}
	stop   context.CancelFunc
	done   chan struct{}
}

// Acquire leases the first free node id and keeps renewing it until Close.
func Acquire(ctx context.Context, c rueidis.Client, ttl time.Duration) (*Lease, error) {
	return AcquireIn(ctx, c, ttl, 0, LeasedNodes-1)
}

// AcquireIn is Acquire among node ids from..to (inclusive): a gateway's own
// range, the only lease keys its Redis user may write (roles.GatewayUser), so
// that a gateway's login cannot take another gateway's ids.
func AcquireIn(ctx context.Context, c rueidis.Client, ttl time.Duration, from, to int) (*Lease, error) {
	if from < 0 || to >= LeasedNodes || from > to {
		return nil, fmt.Errorf("orderid: node range %d-%d outside 0-%d", from, to, LeasedNodes-1)
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	token := hex.EncodeToString(b[:])
	// Start at a random node so that gateways starting together rarely collide.
	start := int(b[0])<<8 | int(b[1])
	span := to - from + 1
	for i := 0; i < span; i++ {
		n := from + (start+i)%span
		key := lua.NodeLease(n)
		sent := time.Now()
		err := c.Do(ctx, c.B().Set().Key(key).Value(token).Nx().PxMilliseconds(ttl.Milliseconds()).Build()).Error()
		if rueidis.IsRedisNil(err) {
			continue // taken
		}
		if err != nil {
			return nil, fmt.Errorf("orderid: lease node %d: %w", n, err)
		}
		rctx, cancel := context.WithCancel(context.Background())
		l := &Lease{Generator: New(n), client: c, key: key, token: token, ttl: ttl,
			lost: make(chan struct{}), stop: cancel, done: make(chan struct{})}
		// An id made before a restart of this node with a clock that stepped back
		// could repeat; starting the sequence clock at "now" and holding the lease
		// for a TTL after the last holder keeps that window closed in practice.
		go l.keep(rctx, sent.Add(ttl))
		return l, nil
	}
	return nil, ErrNoNode
}

// keep renews the lease. deadline is when the key expires at the latest (the
// TTL runs from when Redis ran the command, which is after we sent it). The
// lease is given up before then, with a guard of a sixth of the TTL for
// scheduling and clock rates: once the key expires another node may take the
// id, and two generators of one node can make the same id.
func (l *Lease) keep(ctx context.Context, deadline time.Time) {
	defer close(l.done)
	// Renew at least every second, whatever the TTL: a Redis that restarted
	// empty has dropped the key, and until a renewal notices, another node
	// could take the same id. The window is one renewal interval.
	t := time.NewTicker(min(l.ttl/3, time.Second))
	defer t.Stop()
	guard := l.ttl / 6
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sent := time.Now()
		end := sent.Add(l.ttl / 3)
		if last := deadline.Add(-guard); last.Before(end) {
			end = last
		}
		rctx, cancel := context.WithDeadline(ctx, end)
		ok, err := lua.RenewLock(rctx, l.client, l.key, l.token, l.ttl)
		cancel()
		switch {
		case err == nil && ok:
			deadline = sent.Add(l.ttl)
		case err == nil:
			slog.Error("order id lease taken by another node", "key", l.key)
			close(l.lost)
			return
		case ctx.Err() != nil:
			return // Close
		case time.Now().Add(l.ttl / 3).After(deadline.Add(-guard)):
			// The next renewal might not end in time: give the id up while it
			// is still ours.
			slog.Error("order id lease expiring: Redis unreachable", "key", l.key, "err", err)
			close(l.lost)
			return
		default:
			slog.Warn("order id lease renewal failed; retrying", "key", l.key, "err", err)
		}
	}
}

// Lost is closed when the lease is lost.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Valid reports whether the lease is still held.
func (l *Lease) Valid() bool {
	select {
	case <-l.lost:
		return false
	default:
		return true
	}
}

// Close stops renewing and frees the node id.
func (l *Lease) Close(ctx context.Context) error {
	l.stop()
	<-l.done
	return lua.Unlock(ctx, l.client, l.key, l.token)
}
