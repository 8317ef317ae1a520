package gateway

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/flashgate/flashgate/lua"
)

// releaseJob is one reservation to undo: an admission or a publish failed on
// our side and the buyer was answered 503.
type releaseJob struct {
	s       *sale
	user    string // whose order: a split sale keeps it in their home bucket
	id      uint64
	region  string
	charges string
	reason  string
}

// releases is the gateway's queue of undos. When Redis is away every failed
// admission would otherwise park a goroutine of its own retrying for
// undoPatience: a flood against a paused Redis made tens of thousands. A fixed
// pool works the queue instead; what does not fit is left to reconcile, which
// finds every reservation older than its threshold whatever became of the
// request (a 503'd reservation it finds is released or republished by the
// same rules as a gateway that died before its publish).
type releases struct {
	q        chan releaseJob
	overflow atomic.Int64
}

func newReleases(depth int) *releases {
	return &releases{q: make(chan releaseJob, depth)}
}

// enqueueRelease hands a reservation to the release workers; false when the
// queue is full (the reservation is then reconcile's).
func (g *Gateway) enqueueRelease(j releaseJob) bool {
	select {
	case g.releases.q <- j:
		g.metrics.ReleaseQueued(1)
		return true
	default:
		g.metrics.ReleaseOverflow()
		// An outage overflows the queue by the thousand: one line per 1,000
		// says so without flooding the log (the metric counts each).
		if n := g.releases.overflow.Add(1); n%1000 == 1 {
			slog.Warn("release queue full; leaving reservations to reconcile", "sale", j.s.spec.ID, "order", j.id,
				"reason", j.reason, "overflowed", n)
		}
		return false
	}
}

// releaseWorker works the queue until ctx ends; what is still queued then is
// left to reconcile.
func (g *Gateway) releaseWorker(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-g.releases.q:
			g.metrics.ReleaseQueued(-1)
			g.releaseUntilAnswered(ctx, j.s, j.user, j.id, j.region, j.charges, j.reason)
		}
	}
}

// undoPatience is how long a release retries before it says so in the log;
// it goes on retrying until Redis answers (or the gateway stops). Giving up
// would leave the reservation of a request answered 503 to reconcile, which
// republishes it: a stopped Redis runs the admissions it had read when it
// wakes, before any release, so those 503s would become orders (the chaos
// scenario "redis down, degrade=mysql" counted 480 with a 10 s give-up
// against a 20 s stop).
const undoPatience = 10 * time.Second

// releaseUntilAnswered releases an order in gateway mode, retrying failures
// until Redis answers or ctx ends (then the reservation, if any, is
// reconcile's).
func (g *Gateway) releaseUntilAnswered(ctx context.Context, s *sale, user string, id uint64, region, charges, reason string) {
	deadline := time.Now().Add(undoPatience)
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		rel, err := g.scripts.Release(rctx, g.rc, s.keys.Home(user), id, region, charges, lua.ReleaseGateway, reason)
		cancel()
		if err == nil {
			if rel.Claimed || (rel.Status != "" && rel.Status != lua.StatusReleased) {
				// Redis was away for longer than the request could wait, and the
				// message got through meanwhile: its buyer was told 503, yet the
				// order goes on. Rare (Redis and NATS failing together); loud.
				slog.Error("an order answered 503 went through: its release came after the backend's claim",
					"sale", s.spec.ID, "order", id, "status", rel.Status)
			}
			if rel.Released {
				slog.Info("undid a reservation whose request failed", "sale", s.spec.ID, "order", id, "reason", reason)
				g.restocked(s, region)
			}
			return
		}
		if ctx.Err() != nil {
			slog.Error("could not undo a reservation; reconcile will", "sale", s.spec.ID, "order", id, "err", err)
			return
		}
		if time.Now().After(deadline) {
			slog.Warn("still undoing a reservation: Redis does not answer", "sale", s.spec.ID, "order", id, "err", err)
			deadline = time.Now().Add(undoPatience)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}
