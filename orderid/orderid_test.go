package orderid

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// clock is a settable clock for a generator.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

func withClock(node int, t time.Time) (*Generator, *clock) {
	c := &clock{t: t}
	g := New(node)
	g.now = c.now
	return g, c
}

func parts(id uint64) (ms uint64, node int, seq uint64) {
	return id >> (nodeBits + seqBits), NodeOf(id), id & seqMask
}

func TestConcurrentUniqueAndIncreasing(t *testing.T) {
	const workers, perWorker = 8, 100_000
	g := New(MaxNode)
	out := make([][]uint64, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			ids := make([]uint64, perWorker)
			for i := range ids {
				ids[i] = g.Next()
			}
			out[w] = ids
		})
	}
	wg.Wait()
	all := make([]uint64, 0, workers*perWorker)
	for w, ids := range out {
		for i, id := range ids {
			// Each goroutine sees strictly increasing ids.
			if i > 0 && id <= ids[i-1] {
				t.Fatalf("worker %d: id %d after %d", w, id, ids[i-1])
			}
			if NodeOf(id) != MaxNode {
				t.Fatalf("id %d: node %d", id, NodeOf(id))
			}
		}
		all = append(all, ids...)
	}
	slices.Sort(all)
	for i := 1; i < len(all); i++ {
		if all[i] == all[i-1] {
			t.Fatalf("duplicate id %d", all[i])
		}
	}
}

func TestSequenceRollsOver(t *testing.T) {
	t0 := Epoch.Add(1000 * time.Hour).Add(123 * time.Millisecond)
	ms0 := uint64(t0.Sub(Epoch).Milliseconds())
	g, clk := withClock(5, t0)
	var last uint64
	for i := 0; i <= seqMask; i++ {
		id := g.Next()
		if ms, node, seq := parts(id); ms != ms0 || node != 5 || seq != uint64(i) {
			t.Fatalf("id %d = ms %d node %d seq %d; want ms %d seq %d", i, ms, node, seq, ms0, i)
		}
		if id <= last {
			t.Fatalf("id %d not above %d", id, last)
		}
		last = id
	}
	// The 4,097th id of the millisecond borrows the next one.
	id := g.Next()
	if ms, _, seq := parts(id); ms != ms0+1 || seq != 0 || id <= last {
		t.Fatalf("id past the sequence = ms %d seq %d", ms, seq)
	}
	if got := Time(id); !got.Equal(t0.Truncate(time.Millisecond).Add(time.Millisecond)) {
		t.Fatalf("Time = %v", got)
	}
	// The wall clock reaches the borrowed millisecond: the sequence goes on.
	clk.set(t0.Add(time.Millisecond))
	if ms, _, seq := parts(g.Next()); ms != ms0+1 || seq != 1 {
		t.Fatalf("same ms: ms %d seq %d", ms, seq)
	}
	// The wall clock moves on: the sequence restarts.
	clk.set(t0.Add(5 * time.Millisecond))
	if ms, _, seq := parts(g.Next()); ms != ms0+5 || seq != 0 {
		t.Fatalf("later ms: ms %d seq %d", ms, seq)
	}
}

func TestClockStepsBack(t *testing.T) {
	t0 := Epoch.Add(24 * time.Hour)
	g, clk := withClock(1, t0)
	last := g.Next()
	clk.set(t0.Add(-10 * time.Second))
	// Far more ids than one millisecond holds, all while the clock is behind.
	for i := 0; i < 3*(seqMask+1); i++ {
		id := g.Next()
		if id <= last {
			t.Fatalf("id %d: %d not above %d", i, id, last)
		}
		if Time(id).Before(t0) {
			t.Fatalf("id %d went back in time to %v", i, Time(id))
		}
		last = id
	}
	if got := Time(last); !got.Equal(t0.Add(3 * time.Millisecond)) {
		t.Fatalf("generator clock at %v, want t0+3ms (1+3*4096 ids from t0)", got)
	}
	// The wall clock catches up and passes: ids follow it again.
	clk.set(t0.Add(time.Second))
	id := g.Next()
	if ms, _, seq := parts(id); id <= last || !Time(id).Equal(t0.Add(time.Second)) || seq != 0 {
		t.Fatalf("after catching up: %v seq %d (ms %d)", Time(id), seq, ms)
	}
}

func TestTimeAndNodeRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		node int
		at   time.Time
	}{
		{0, Epoch},
		{1, Epoch.Add(time.Millisecond)},
		{512, time.Date(2026, 5, 17, 12, 34, 56, 789_000_000, time.UTC)},
		{MaxNode, time.Date(2030, 1, 1, 0, 0, 0, 999_999_999, time.UTC)},
		{77, Epoch.Add((1<<41 - 1) * time.Millisecond)}, // the last millisecond of 41 bits (2093)
	} {
		g, _ := withClock(tc.node, tc.at)
		if g.Node() != tc.node {
			t.Errorf("Node() = %d, want %d", g.Node(), tc.node)
		}
		id := g.Next()
		if got, want := Time(id), tc.at.Truncate(time.Millisecond); !got.Equal(want) {
			t.Errorf("node %d at %v: Time = %v, want %v", tc.node, tc.at, got, want)
		}
		if got := NodeOf(id); got != tc.node {
			t.Errorf("node %d at %v: NodeOf = %d", tc.node, tc.at, got)
		}
		if id>>63 != 0 {
			t.Errorf("id %d uses the sign bit (ids must fit int64 for Redis and MySQL)", id)
		}
	}
}

func TestIDsOrderAcrossNodes(t *testing.T) {
	// Ids are time-ordered first: a later millisecond sorts after, whatever the node.
	t0 := Epoch.Add(time.Hour)
	hi, _ := withClock(MaxNode, t0)
	lo, _ := withClock(0, t0.Add(time.Millisecond))
	a, b := hi.Next(), lo.Next()
	if a >= b || a == b {
		t.Fatalf("id of node %d at t0 = %d, of node 0 at t0+1ms = %d", MaxNode, a, b)
	}
}

func TestNewRejectsBadNode(t *testing.T) {
	for _, n := range []int{-1, MaxNode + 1, 1 << 20} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("New(%d) did not panic", n)
				}
			}()
			New(n)
		}()
	}
}

func TestNextDoesNotAllocate(t *testing.T) {
	g := New(3)
	if n := testing.AllocsPerRun(1000, func() { g.Next() }); n != 0 {
		t.Fatalf("Next allocates %v times", n)
	}
}

func BenchmarkNext(b *testing.B) {
	g := New(1)
	b.ReportAllocs()
	for b.Loop() {
		g.Next()
	}
}

func BenchmarkNextParallel(b *testing.B) {
	g := New(1)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			g.Next()
		}
	})
}
