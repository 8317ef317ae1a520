package lua

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/internal/testenv"
)

// TestTransferCrashFinished: a transfer whose taker died after take.lua (units
// out of the giver, in its ledger) is counted by Remaining and landed once by
// FinishTransfers; a landed one is counted once and never landed twice; the
// records go after ledgerKeep and receivedKeep. No unit is lost or made twice.
func TestTransferCrashFinished(t *testing.T) {
	c := testenv.Redis(t, testenv.ClusterAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	k := warmBucketed(ctx, t, c, "xfer", 8, 2, 2)
	now := time.Now()
	stock := func(b int) int64 {
		n, err := c.Do(ctx, c.B().Get().Key(k.buckets[b].stock).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	total := func() int64 {
		rem, err := Remaining(ctx, c, k)
		if err != nil {
			t.Fatal(err)
		}
		return rem[""]
	}
	// The taker dies after take.
	if got, _, _, err := take(ctx, c, k.buckets[1], 0, "t1", "", 3, now.UnixMilli(), replication{}); err != nil || got != 3 {
		t.Fatalf("take: %d %v", got, err)
	}
	if stock(0) != 4 || stock(1) != 1 || total() != 8 {
		t.Fatalf("after take: %d %d, remaining %d", stock(0), stock(1), total())
	}
	if n, err := FinishTransfers(ctx, c, k); err != nil || n != 1 {
		t.Fatalf("finish: %d %v", n, err)
	}
	if stock(0) != 7 || stock(1) != 1 || total() != 8 {
		t.Fatalf("after finish: %d %d, remaining %d", stock(0), stock(1), total())
	}
	if n, err := FinishTransfers(ctx, c, k); err != nil || n != 0 {
		t.Fatalf("finish again: %d %v", n, err)
	}
	// The taker dies after give, before clearing its ledger entry.
	if got, _, _, err := take(ctx, c, k.buckets[0], 1, "t2", "", 2, now.UnixMilli(), replication{}); err != nil || got != 2 {
		t.Fatalf("take: %d %v", got, err)
	}
	if _, err := giveScript.Exec(ctx, c, []string{k.buckets[1].stock, k.buckets[1].xin, k.buckets[1].Epoch}, []string{"t2", "2", "1", ""}).ToArray(); err != nil {
		t.Fatal(err)
	}
	if total() != 8 {
		t.Fatalf("remaining while a landed transfer is uncleared: %d", total())
	}
	if n, err := FinishTransfers(ctx, c, k); err != nil || n != 0 {
		t.Fatalf("finish a landed transfer: %d %v", n, err)
	}
	if stock(0) != 5 || stock(1) != 3 || total() != 8 {
		t.Fatalf("after finishing: %d %d, remaining %d", stock(0), stock(1), total())
	}
	// Young entries stay (a reader's sum may straddle them); old ones go,
	// and the received ids after them.
	if ts, err := PendingTransfers(ctx, c, k); err != nil || len(ts) != 2 {
		t.Fatalf("young ledger: %v %v", ts, err)
	}
	if _, err := finishTransfers(ctx, c, k, time.Until(now.Add(ledgerKeep+time.Second)), replication{}); err != nil {
		t.Fatal(err)
	}
	if ts, err := PendingTransfers(ctx, c, k); err != nil || len(ts) != 0 {
		t.Fatalf("old ledger: %v %v", ts, err)
	}
	if stock(0) != 5 || stock(1) != 3 || total() != 8 {
		t.Fatalf("after clearing: %d %d, remaining %d", stock(0), stock(1), total())
	}
	if _, err := finishTransfers(ctx, c, k, time.Until(now.Add(receivedKeep+time.Minute)), replication{}); err != nil {
		t.Fatal(err)
	}
	for _, b := range k.buckets {
		if n, err := c.Do(ctx, c.B().Hlen().Key(b.xin).Build()).AsInt64(); err != nil || n != 0 {
			t.Fatalf("received ids of bucket %d: %d %v", b.index, n, err)
		}
	}
}

// warmBucketed creates and warms a sale of total units over k buckets on the
// Cluster, and answers its keys (perUser units a buyer, in orders of up to perUser), retired when
// the test ends.
func warmBucketed(ctx context.Context, t *testing.T, c rueidis.Client, id string, total, perUser int64, k int) *Keys {
	t.Helper()
	now := time.Now()
	spec := &flashgate.Sale{ID: testenv.ID(id), Title: "t", Total: total, StartsAt: now.Add(-time.Minute),
		EndsAt: now.Add(time.Hour), PerUserLimit: perUser, PerOrderMax: perUser, Buckets: k}
	var err error
	if spec.BucketTags, err = ChooseBucketTags(ctx, c, spec.ID, k); err != nil {
		t.Fatal(err)
	}
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = Retire(context.Background(), c, spec) })
	if ok, err := Load().Warm(ctx, c, spec, map[string]int64{"": total}); !ok || err != nil {
		t.Fatalf("warm: %v %v", ok, err)
	}
	return KeysOf(spec)
}

// TestTransferAgedByRedisClock: a transfer's ledger entry and received id are
// stamped with the TIME of the master that wrote them, whatever clock the
// caller has: a gateway an hour slow does not make a transfer it just landed
// look older than ledgerKeep, so reconcile keeps its entry (a reader's sum
// may still straddle it) until it is old by Redis's clock.
func TestTransferAgedByRedisClock(t *testing.T) {
	c := testenv.Redis(t, testenv.ClusterAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	k := warmBucketed(ctx, t, c, "xclock", 8, 2, 2)
	slow := time.Now().Add(-time.Hour).UnixMilli() // the caller's clock
	got, _, _, err := take(ctx, c, k.buckets[0], 1, "t-slow", "", 1, slow, replication{})
	if err != nil || got != 1 {
		t.Fatalf("take: %d %v", got, err)
	}
	if _, _, err := land(ctx, c, k, Transfer{ID: "t-slow", From: 0, To: 1, Units: 1}, slow, replication{}); err != nil {
		t.Fatal(err)
	}
	if _, err := FinishTransfers(ctx, c, k); err != nil {
		t.Fatal(err)
	}
	if ts, err := PendingTransfers(ctx, c, k); err != nil || len(ts) != 1 {
		t.Fatalf("ledger after reconcile: %v %v, want the young entry kept", ts, err)
	}
	if _, err := finishTransfers(ctx, c, k, ledgerKeep+time.Second, replication{}); err != nil {
		t.Fatal(err)
	}
	if ts, err := PendingTransfers(ctx, c, k); err != nil || len(ts) != 0 {
		t.Fatalf("ledger past ledgerKeep by Redis's clock: %v %v, want it pruned", ts, err)
	}
	if rem, err := Remaining(ctx, c, k); err != nil || rem[""] != 8 {
		t.Fatalf("Remaining %v %v, want 8", rem, err)
	}
}
