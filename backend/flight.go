package backend

import (
	"context"
	"net/http"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/flashgate/flashgate"
)

// Admin reads that cost MySQL and a sale's hot Redis shard (the ledger,
// reconcile, the live view) run once however many ask at the same time:
// requests that arrive while one is under way wait for it and get its
// answer (singleflight). A client that hangs up does not cancel the shared
// work for the others; flightTimeout bounds it.

// flightTimeout bounds one shared read or reconcile.
const flightTimeout = 30 * time.Second

// answer is a handler's answer, computed once and written to every caller.
type answer struct {
	status int
	body   any
}

func errAnswer(status int, code flashgate.Code, msg string) answer {
	return answer{status, map[string]string{"code": string(code), "message": msg}}
}

// flights are the admin API's shared computations, and what they did (the
// tests read the counters).
type flights struct {
	g singleflight.Group
	// ledgerCalls: ledger requests; ledgerReads: the reads they caused;
	// reconcileRuns: reconciles run on request.
	ledgerCalls, ledgerReads, reconcileRuns atomic.Int64
	// ledgerHook, when set (tests), runs inside each ledger read.
	ledgerHook func()
}

// shared runs f once for every concurrent caller with the same key.
func (f *flights) shared(ctx context.Context, key string, fn func(ctx context.Context) answer) answer {
	ch := f.g.DoChan(key, func() (any, error) {
		c, cancel := context.WithTimeout(context.WithoutCancel(ctx), flightTimeout)
		defer cancel()
		return fn(c), nil
	})
	select {
	case res := <-ch:
		return res.Val.(answer)
	case <-ctx.Done():
		return errAnswer(http.StatusServiceUnavailable, flashgate.CodeUnavailable, "request ended: "+ctx.Err().Error())
	}
}
