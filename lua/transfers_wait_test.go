package lua

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/flashgate/flashgate/internal/testenv"
)

// TestTransfersWait: under redis.wait_replicas a transfer between buckets is
// landed only once the giver's replicas have its take. On the stack's Cluster
// (one replica behind every master), a sale of 3 buckets with 2 units each and
// its home bucket drained: asking for 2 replicas (more than any master has),
// the takes come back unconfirmed, so nothing lands: the buyer is told sold
// out with the units still counted (in the givers' ledgers, Remaining 4, no
// sold-out mark), and reconcile waiting for 2 replicas lands nothing either.
// Waiting for 1, reconcile lands them all into the home, once; a buyer whose
// gathering waits for 1 replica is then admitted through transfers of its own.
// The units are 4 from the first read to the last: none lost, none counted
// twice.
func TestTransfersWait(t *testing.T) {
	c := testenv.Redis(t, testenv.ClusterAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	scripts := Load()
	k := warmBucketed(ctx, t, c, "xwait", 6, 4, 3)
	stock := func(b int) int64 {
		n, err := c.Do(ctx, c.B().Get().Key(k.buckets[b].stock).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	remaining := func(what string) {
		t.Helper()
		rem, err := Remaining(ctx, c, k)
		if err != nil || rem[""] != 4 {
			t.Fatalf("%s: Remaining %v %v, want 4", what, rem, err)
		}
	}
	user := func(p string) string {
		for j := 0; ; j++ {
			if u := p + strconv.Itoa(j); HomeBucket(u, 3) == 0 {
				return u
			}
		}
	}
	buy := func(u string, qty int64, replicas int, timeout time.Duration) Admission {
		t.Helper()
		now := time.Now()
		a, err := scripts.AdmitBucketedWait(ctx, c, k, AdmitArgs{User: u, Quantity: qty, OrderID: uint64(now.UnixNano()),
			Now: now, PayBy: now.Add(time.Minute)}, replicas, timeout)
		if err != nil {
			t.Fatalf("admit %s: %v", u, err)
		}
		return a
	}
	// Drain bucket 0 (its own 2 units, no transfer).
	if a := buy(user("a"), 2, 1, time.Second); a.Outcome != Admitted || stock(0) != 0 {
		t.Fatalf("drain the home bucket: %+v, stock %d", a, stock(0))
	}
	remaining("drained home")

	// 2 replicas: every take is unconfirmed; nothing lands.
	a := buy(user("b"), 2, 2, 20*time.Millisecond)
	if a.Outcome != SoldOut || a.Remaining != 4 {
		t.Fatalf("gathering with unconfirmed takes: %+v, want sold out with 4 remaining (on the move)", a)
	}
	if stock(0) != 0 {
		t.Fatalf("home stock %d: units of unconfirmed takes landed", stock(0))
	}
	ts, err := PendingTransfers(ctx, c, k)
	if err != nil || len(ts) == 0 {
		t.Fatalf("pending transfers: %v %v, want the unconfirmed takes", ts, err)
	}
	var onTheMove int64
	for _, tr := range ts {
		onTheMove += tr.Units
	}
	if onTheMove != 4 || stock(1)+stock(2) != 0 {
		t.Fatalf("units in the ledgers %d, in the givers %d+%d: want 4, 0", onTheMove, stock(1), stock(2))
	}
	remaining("unconfirmed takes")
	if n, err := FinishTransfersWait(ctx, c, k, 2, 20*time.Millisecond); err != nil || n != 0 || stock(0) != 0 {
		t.Fatalf("reconcile waiting for 2 replicas: landed %d %v, home stock %d; want nothing landed", n, err, stock(0))
	}
	remaining("reconcile unconfirmed")

	// 1 replica: reconcile confirms each take and lands it, once.
	if n, err := FinishTransfersWait(ctx, c, k, 1, time.Second); err != nil || n != len(ts) || stock(0) != 4 {
		t.Fatalf("reconcile waiting for 1 replica: landed %d of %d, %v, home stock %d; want all, 4", n, len(ts), err, stock(0))
	}
	if n, err := FinishTransfersWait(ctx, c, k, 1, time.Second); err != nil || n != 0 || stock(0) != 4 {
		t.Fatalf("reconcile again: landed %d %v, home stock %d; want none, 4", n, err, stock(0))
	}
	remaining("landed")

	// Move the units away from the home again (to bucket 1), and let a buyer
	// of bucket 0 gather them waiting for 1 replica: admitted.
	if got, _, acked, err := take(ctx, c, k.buckets[0], 1, "back", "", 4, time.Now().UnixMilli(), replication{1, time.Second}); err != nil || got != 4 || !acked {
		t.Fatalf("take back: %d %v %v", got, acked, err)
	}
	if _, acked, err := land(ctx, c, k, Transfer{ID: "back", From: 0, To: 1, Units: 4}, time.Now().UnixMilli(), replication{1, time.Second}); err != nil || !acked {
		t.Fatalf("land back: %v %v", acked, err)
	}
	remaining("moved to bucket 1")
	if a := buy(user("c"), 3, 1, time.Second); a.Outcome != Admitted || a.Remaining != 0 || stock(1) != 1 {
		t.Fatalf("gathering with confirmed takes: %+v, bucket 1 stock %d; want admitted, 1 left in bucket 1", a, stock(1))
	}
}

// TestTransfersWaitRepairs: the PATCH that lowers a split sale's stock
// (lowerBuckets) lands the transfers under way only once the replicas
// confirm each take, as reconcile does. On the stack's Cluster, a sale of 3
// buckets whose home was drained and whose other buckets' units were taken
// for it with takes no replica set could confirm (2 replicas asked, 1 behind
// each master): a lowering waiting for 2 replicas lands nothing (its units
// are in no stock: ErrStockTaken). Waiting for 1, reconcile then lands them
// once: the sale holds its 4 units from the first read to the last. (The
// stock repair is a rebuild, which sets every bucket from MySQL and clears
// the ledgers: nothing on the move is landed by it.)
func TestTransfersWaitRepairs(t *testing.T) {
	c := testenv.Redis(t, testenv.ClusterAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := warmBucketed(ctx, t, c, "xrep", 6, 4, 3)
	spec, err := LoadSale(ctx, c, k.Sale)
	if err != nil {
		t.Fatal(err)
	}
	stocks := func() (n int64) {
		for _, b := range k.buckets {
			v, err := c.Do(ctx, c.B().Get().Key(b.stock).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			n += v
		}
		return n
	}
	remaining := func(what string) {
		t.Helper()
		rem, err := Remaining(ctx, c, k)
		if err != nil || rem[""] != 4 {
			t.Fatalf("%s: Remaining %v %v, want 4", what, rem, err)
		}
	}
	user := func(p string) string {
		for j := 0; ; j++ {
			if u := p + strconv.Itoa(j); HomeBucket(u, 3) == 0 {
				return u
			}
		}
	}
	scripts := Load()
	buy := func(u string, qty int64, replicas int, timeout time.Duration) Admission {
		t.Helper()
		now := time.Now()
		a, err := scripts.AdmitBucketedWait(ctx, c, k, AdmitArgs{User: u, Quantity: qty, OrderID: uint64(now.UnixNano()),
			Now: now, PayBy: now.Add(time.Minute)}, replicas, timeout)
		if err != nil {
			t.Fatalf("admit %s: %v", u, err)
		}
		return a
	}
	if a := buy(user("a"), 2, 1, time.Second); a.Outcome != Admitted {
		t.Fatalf("drain the home bucket: %+v", a)
	}
	if a := buy(user("b"), 2, 2, 20*time.Millisecond); a.Outcome != SoldOut || stocks() != 0 {
		t.Fatalf("gathering with unconfirmed takes: %+v, stocks %d; want sold out, 0 in stock", a, stocks())
	}
	unlanded := func(what string) {
		t.Helper()
		ts, err := PendingTransfers(ctx, c, k)
		if err != nil {
			t.Fatal(err)
		}
		var units int64
		for _, tr := range ts {
			units += tr.Units
		}
		if units != 4 || stocks() != 0 {
			t.Fatalf("%s: %d units in the ledgers, %d in stock; want the 4 unconfirmed units still on the move", what, units, stocks())
		}
	}
	unlanded("before")

	lower := *spec
	lower.Total = 5
	if err := UpdateWait(ctx, c, &lower, map[string]int64{"": -1}, nil, 2, 20*time.Millisecond); !errors.Is(err, ErrStockTaken) {
		t.Fatalf("lowering waiting for 2 replicas: %v, want ErrStockTaken (the units on the move are in no stock)", err)
	}
	unlanded("after the lowering")
	remaining("after the lowering")

	if n, err := FinishTransfersWait(ctx, c, k, 1, time.Second); err != nil || n == 0 || stocks() != 4 {
		t.Fatalf("reconcile waiting for 1 replica: landed %d %v, stocks %d; want them landed, 4", n, err, stocks())
	}
	remaining("landed")
}
