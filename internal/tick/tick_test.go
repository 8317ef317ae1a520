package tick

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestEveryStopsWithItsContext: passes run on ticks, and none after the
// context ended and Every returned.
func TestEveryStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		Every(ctx, time.Millisecond, func(time.Time) {
			if n.Add(1) == 3 {
				cancel()
			}
		})
	}()
	<-done
	if got := n.Load(); got != 3 {
		t.Fatalf("%d passes, want 3 (the third cancels)", got)
	}
}
