// Package tick runs a process's periodic work: the backend leader's passes
// (reconcile, retention, the rewarm of stale sales, the sale gauges) and the
// gateway's (its stats, its sold-out marks).
package tick

import (
	"context"
	"time"
)

// Every runs pass with the tick's time after every tick of d until ctx ends.
// The first pass is one d after the start; a pass that takes longer than d
// makes the ticker drop ticks, never run two passes at once.
func Every(ctx context.Context, d time.Duration, pass func(now time.Time)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			pass(now)
		}
	}
}
