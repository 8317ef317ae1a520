package gateway

import (
	"context"
	"time"

	"github.com/flashgate/flashgate/lua"
)

// Sold-out hints are other gateways' word, and whoever holds a gateway's NATS
// credential can send one for any sale every few milliseconds. A hint marks
// nothing by itself: it asks this gateway to read the sale's stock in Redis
// now, and the marks follow what Redis says (as the refresh loop's do every
// 500 ms). One worker reads, one sale at a time; a sale is queued at most
// once, and read at most once per hintCheckEvery, so a flood of hints costs
// at most one Redis read per cached sale per hintCheckEvery and no goroutine
// of its own (docs/gateway.md, "Sold-out hints").

const (
	// hintCheckEvery is the least time between two reads of one sale's stock
	// on sold-out hints; a hint sooner is left to the refresh loop.
	hintCheckEvery = 50 * time.Millisecond
	// hintQueue bounds the sales waiting for a read; a hint finding it full
	// is dropped (the refresh loop reads every sale anyway).
	hintQueue = 64
	// hintReadTimeout bounds one read.
	hintReadTimeout = time.Second
)

// onSoldOutHint queues sale s for a read of its stock in Redis.
func (g *Gateway) onSoldOutHint(s *sale) {
	now := g.now().UnixMilli()
	last := s.hintChecked.Load()
	if now-last < hintCheckEvery.Milliseconds() || !s.hintQueued.CompareAndSwap(false, true) {
		return
	}
	select {
	case g.hints <- s:
	default:
		s.hintQueued.Store(false)
	}
}

// hintWorker reads the stock of the sales sold-out hints named, until ctx ends.
func (g *Gateway) hintWorker(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-g.hints:
			s.hintChecked.Store(g.now().UnixMilli())
			c, cancel := context.WithTimeout(ctx, hintReadTimeout)
			g.checkSoldOut(c, s)
			cancel()
			s.hintQueued.Store(false)
		}
	}
}

// checkSoldOut sets the sale's sold-out marks from its stock in Redis: a
// region (or the sale) is marked only where Redis has none left. A failed
// read marks nothing (fail closed means no answer from memory either way).
func (g *Gateway) checkSoldOut(ctx context.Context, s *sale) {
	rem, err := lua.Remaining(ctx, g.rc, s.keys)
	if err != nil {
		return
	}
	for r, n := range rem {
		if f := s.soldOutFlag(r); f != nil {
			f.Store(n <= 0)
		}
	}
}
