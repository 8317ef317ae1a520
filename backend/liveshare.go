package backend

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
)

// liveSnapshots serve the live view (GET /ui/ and /ui/live.json) from one
// snapshot per liveSnapshotAge, however many viewers poll: reading it costs
// MySQL a query and each recent sale's hot Redis shard an HGETALL of its
// reservations, and every open tab polls every second. The first request
// after a snapshot has aged takes a new one; the requests that arrive while
// it is taken wait for it (singleflight) and share it.
type liveSnapshots struct {
	live *live
	g    singleflight.Group

	mu   sync.Mutex
	last LiveView
	at   time.Time // when last was taken; zero: none yet

	// taken counts the snapshots taken (tests).
	taken atomic.Int64
}

// liveSnapshotAge is how long a snapshot is served: the view's own poll.
const liveSnapshotAge = time.Second

// view is the current snapshot, taking a new one if it is older than
// liveSnapshotAge. A failed read is not kept: the next request tries again.
func (s *liveSnapshots) view(ctx context.Context) (LiveView, error) {
	s.mu.Lock()
	if !s.at.IsZero() && time.Since(s.at) < liveSnapshotAge {
		v := s.last
		s.mu.Unlock()
		return v, nil
	}
	s.mu.Unlock()
	ch := s.g.DoChan("view", func() (any, error) {
		c, cancel := context.WithTimeout(context.WithoutCancel(ctx), flightTimeout)
		defer cancel()
		// Another flight may have finished between the check and here.
		s.mu.Lock()
		if !s.at.IsZero() && time.Since(s.at) < liveSnapshotAge {
			v := s.last
			s.mu.Unlock()
			return v, nil
		}
		s.mu.Unlock()
		s.taken.Add(1)
		v, err := s.live.view(c)
		if err != nil {
			return v, err
		}
		s.mu.Lock()
		s.last, s.at = v, time.Now()
		s.mu.Unlock()
		return v, nil
	})
	select {
	case res := <-ch:
		return res.Val.(LiveView), res.Err
	case <-ctx.Done():
		return LiveView{}, ctx.Err()
	}
}
