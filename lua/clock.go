package lua

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
)

// Redis's clock decides (invariant 8): the scripts read TIME for the sale
// window and the counters' expiry, and stamp reservations and holds with it.
// The ages of those are judged against the same clock: the TIME of the
// master that wrote them (ServerTime on one of that tag's keys).

// timeScript answers TIME on the master of its key's slot (a keyless TIME
// would reach any node of a Cluster). It reads the key not.
var timeScript = newReadScript("time", `local t = redis.call('TIME')
return {t[1], t[2]}`)

// ServerTime is the clock of the Redis master that holds key.
func ServerTime(ctx context.Context, c rueidis.Client, key string) (time.Time, error) {
	v, err := timeScript.Exec(ctx, c, []string{key}, nil).AsStrSlice()
	if err != nil {
		return time.Time{}, fmt.Errorf("time: %w", err)
	}
	if len(v) != 2 {
		return time.Time{}, fmt.Errorf("time: answer %q", v)
	}
	sec, err1 := strconv.ParseInt(v[0], 10, 64)
	usec, err2 := strconv.ParseInt(v[1], 10, 64)
	if err1 != nil || err2 != nil {
		return time.Time{}, fmt.Errorf("time: answer %q", v)
	}
	return time.Unix(sec, usec*1000).UTC(), nil
}

// Older reports which of resv (reservations as Reservations reads them) are
// older than age, each judged by the clock of the master holding it (its
// buyer's home bucket on a split sale): admit.lua stamped its created time
// with that clock, so no two machines' clocks are compared.
func Older(ctx context.Context, c rueidis.Client, k *Keys, resv map[uint64]flashgate.Order, age time.Duration) (map[uint64]bool, error) {
	out := make(map[uint64]bool, len(resv))
	clocks := map[string]time.Time{}
	for id, o := range resv {
		h := k.Home(o.UserID)
		now, ok := clocks[h.Resv]
		if !ok {
			var err error
			if now, err = ServerTime(ctx, c, h.Resv); err != nil {
				return nil, fmt.Errorf("age of reservations of %s: %w", k.Sale, err)
			}
			clocks[h.Resv] = now
		}
		if !o.CreatedAt.After(now.Add(-age)) {
			out[id] = true
		}
	}
	return out, nil
}

// SkewEvery is how often a process samples its clock against Redis's
// (WatchSkew).
const SkewEvery = 10 * time.Second

// Skew measures the clock now against Redis's: on every node c knows (each
// master and replica of a Cluster), TIME, read between two readings of the
// local clock; the local clock at the middle of the round trip (the first
// reading plus half the round trip, measured on the monotonic clock) less
// Redis's answer is that node's skew. It answers the skew of the largest
// magnitude: positive when this process's clock is ahead of Redis's.
func Skew(ctx context.Context, c rueidis.Client, now func() time.Time) (time.Duration, error) {
	var worst time.Duration
	var errs []error
	for addr, n := range c.Nodes() {
		local := now()
		start := time.Now()
		v, err := n.Do(ctx, n.B().Time().Build()).AsStrSlice()
		rtt := time.Since(start)
		if err != nil || len(v) != 2 {
			errs = append(errs, fmt.Errorf("time of %s: %v %q", addr, err, v))
			continue
		}
		sec, err1 := strconv.ParseInt(v[0], 10, 64)
		usec, err2 := strconv.ParseInt(v[1], 10, 64)
		if err1 != nil || err2 != nil {
			errs = append(errs, fmt.Errorf("time of %s: answer %q", addr, v))
			continue
		}
		d := local.Add(rtt / 2).Sub(time.Unix(sec, usec*1000))
		if d.Abs() > worst.Abs() {
			worst = d
		}
	}
	if len(errs) > 0 {
		return worst, errors.Join(errs...)
	}
	return worst, nil
}

// WatchSkew samples Skew every SkewEvery (and once at once) until ctx ends,
// handing each measure to set (a process's gauge, flashgate_redis_clock_skew_seconds).
// A sample that fails on some node keeps the others' measure.
func WatchSkew(ctx context.Context, c rueidis.Client, now func() time.Time, set func(time.Duration)) {
	t := time.NewTicker(SkewEvery)
	defer t.Stop()
	for {
		sctx, cancel := context.WithTimeout(ctx, SkewEvery/2)
		d, err := Skew(sctx, c, now)
		cancel()
		if err == nil || d != 0 {
			set(d)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
