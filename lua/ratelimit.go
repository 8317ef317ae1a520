package lua

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

//go:embed gcra.lua
var gcraSrc string

var gcraScript = newScript("gcra", gcraSrc)

// gcraReply is the first word of gcra.lua's answer.
type gcraReply string

const (
	gcraAllow gcraReply = "allow" // the request is within the limit
	gcraDeny  gcraReply = "deny"  // over it: the wait comes with it
)

// RateAllow takes one request from the fleet-wide limit at key (RateKey): a
// GCRA kept in Redis on Redis's clock, with interval between two requests at
// the steady rate and tolerance (interval × burst) of running ahead. When it
// refuses, wait is how long until a request would pass.
func RateAllow(ctx context.Context, c rueidis.Client, key string, interval, tolerance time.Duration) (ok bool, wait time.Duration, err error) {
	res, err := gcraScript.Exec(ctx, c, []string{key},
		[]string{strconv.FormatInt(max(1, interval.Microseconds()), 10), strconv.FormatInt(tolerance.Microseconds(), 10)}).AsStrSlice()
	if err != nil {
		return false, 0, fmt.Errorf("rate limit %s: %w", key, err)
	}
	switch {
	case len(res) == 1 && gcraReply(res[0]) == gcraAllow:
		return true, 0, nil
	case len(res) == 2 && gcraReply(res[0]) == gcraDeny:
		us, _ := strconv.ParseInt(res[1], 10, 64)
		return false, time.Duration(us) * time.Microsecond, nil
	}
	return false, 0, fmt.Errorf("rate limit %s: unexpected reply %q", key, res)
}
