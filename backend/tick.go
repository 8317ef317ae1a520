package backend

import (
	"context"
	"time"
)

// everyTick runs pass after every tick of d until ctx ends: the shape of the
// leader's periodic work (reconcile, retention, the rewarm of stale sales, the
// sale gauges), whose ctx is the leader lock's. The first pass is one d after
// the start.
func everyTick(ctx context.Context, d time.Duration, pass func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			pass()
		}
	}
}
