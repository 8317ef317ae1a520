package lua_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// newBucketed warms a sale of total units split over k buckets, their tags
// chosen from c's slot map; edit changes the spec before warming.
func newBucketed(t testing.TB, c rueidis.Client, k int, total int64, edit func(*flashgate.Sale)) *sale {
	t.Helper()
	var err error
	var spec *flashgate.Sale
	s := newSale(t, c, func(sp *flashgate.Sale) {
		sp.Total, sp.Buckets = total, k
		if edit != nil {
			edit(sp)
		}
		if sp.BucketTags, err = lua.ChooseBucketTags(ctx(t), c, sp.ID, k); err != nil {
			t.Fatal(err)
		}
		spec = sp
	})
	s.k = lua.KeysOf(spec)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = lua.Retire(ctx, c, spec)
	})
	return s
}

// buyBucketed admits one purchase the way a gateway does for a split sale.
func (s *sale) buyBucketed(user string, qty int64, region string) lua.Admission {
	s.t.Helper()
	now := time.Now()
	a, err := scripts.AdmitBucketed(ctx(s.t), s.c, s.k, lua.AdmitArgs{User: user, Quantity: qty, OrderID: nextID(),
		Now: now, PayBy: now.Add(time.Minute), Region: region})
	if err != nil {
		s.t.Fatalf("admit %s: %v", user, err)
	}
	return a
}

// userIn finds a user id whose home is bucket b of k.
func userIn(b, k int, n int) string {
	for i := 0; ; i++ {
		u := "u" + strconv.Itoa(n) + "-" + strconv.Itoa(i)
		if lua.HomeBucket(u, k) == b {
			return u
		}
	}
}

// TestBucketTagsSpread: on the Cluster, the 12 buckets of a sale land 4 on
// each of the 3 masters, and Slot agrees with CLUSTER KEYSLOT.
func TestBucketTagsSpread(t *testing.T) {
	c := testenv.Redis(t, testenv.ClusterAddrs())
	tags, err := lua.ChooseBucketTags(ctx(t), c, "spread", 12)
	if err != nil {
		t.Fatal(err)
	}
	if len(tags) != 12 {
		t.Fatalf("%d tags", len(tags))
	}
	k := lua.BucketedKeysFor("spread", nil, tags)
	nodes := map[string]int{}
	for _, b := range k.Buckets() {
		slot, err := c.Do(ctx(t), c.B().ClusterKeyslot().Key(b.Meta).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if int(slot) != lua.Slot(b.Meta) {
			t.Fatalf("Slot(%s) = %d, Redis says %d", b.Meta, lua.Slot(b.Meta), slot)
		}
	}
	// Ownership: which master serves each bucket's slot, from CLUSTER SLOTS.
	res, err := c.Do(ctx(t), c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range k.Buckets() {
		sl := lua.Slot(b.Meta)
		for _, r := range res {
			v, _ := r.ToArray()
			lo, _ := v[0].AsInt64()
			hi, _ := v[1].AsInt64()
			if int64(sl) >= lo && int64(sl) <= hi {
				node, _ := v[2].ToArray()
				port, _ := node[1].AsInt64()
				nodes[strconv.FormatInt(port, 10)]++
			}
		}
	}
	if len(nodes) != 3 {
		t.Fatalf("buckets on %d masters, want 3: %v", len(nodes), nodes)
	}
	for n, cnt := range nodes {
		if cnt != 4 {
			t.Errorf("master %s holds %d buckets, want 4 (%v)", n, cnt, nodes)
		}
	}
}

// TestBucketDrainedServesFromOthers: buyers all at home in bucket 0 buy every
// unit of the sale, though bucket 0 held a quarter of them; then the next
// buyer is told sold out, and the sale's remaining is 0.
func TestBucketDrainedServesFromOthers(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newBucketed(t, c, 4, 8, func(sp *flashgate.Sale) { sp.PerUserLimit, sp.PerOrderMax = 2, 2 })
		for i := range 4 {
			if a := s.buyBucketed(userIn(0, 4, i), 2, ""); a.Outcome != lua.Admitted {
				t.Fatalf("buyer %d: %v", i, a.Outcome)
			}
		}
		if a := s.buyBucketed(userIn(0, 4, 9), 1, ""); a.Outcome != lua.SoldOut || a.Remaining != 0 {
			t.Fatalf("after the last unit: %v %d", a.Outcome, a.Remaining)
		}
		if a := s.buyBucketed(userIn(3, 4, 9), 1, ""); a.Outcome != lua.SoldOut {
			t.Fatalf("another bucket after the last unit: %v", a.Outcome)
		}
		rem, err := lua.Remaining(ctx(t), c, s.k)
		if err != nil || rem[""] != 0 {
			t.Fatalf("remaining %v %v", rem, err)
		}
		// Limits still hold in the home bucket: buyer 0 has 2 of 2.
		if a := s.buyBucketed(userIn(0, 4, 0), 1, ""); a.Outcome != lua.LimitReached {
			t.Fatalf("buyer at the limit: %v", a.Outcome)
		}
	})
}

// TestBucketPartialGather: a purchase of 2 when the sale holds 1 unit is sold
// out, and the unit it gathered stays buyable by a buyer of any bucket.
func TestBucketPartialGather(t *testing.T) {
	c := testenv.Redis(t, testenv.ClusterAddrs())
	s := newBucketed(t, c, 4, 4, nil)
	for b := 1; b < 4; b++ {
		if a := s.buyBucketed(userIn(b, 4, 0), 1, ""); a.Outcome != lua.Admitted {
			t.Fatalf("bucket %d: %v", b, a.Outcome)
		}
	}
	// One unit is left, in bucket 0 or wherever the gathers put it.
	if a := s.buyBucketed(userIn(1, 4, 1), 2, ""); a.Outcome != lua.SoldOut || a.Remaining != 1 {
		t.Fatalf("2 of 1 left: %v remaining %d", a.Outcome, a.Remaining)
	}
	if a := s.buyBucketed(userIn(2, 4, 1), 1, ""); a.Outcome != lua.Admitted {
		t.Fatalf("the last unit: %v", a.Outcome)
	}
}

// TestBucketRegions: each region's stock is split over the buckets and
// gathered per region.
func TestBucketRegions(t *testing.T) {
	c := testenv.Redis(t, testenv.ClusterAddrs())
	s := newBucketed(t, c, 3, 9, func(sp *flashgate.Sale) {
		sp.Regions = map[string]int64{"bj": 6, "sh": 3}
		sp.PerUserLimit, sp.PerOrderMax = 9, 3
	})
	rem, err := lua.Remaining(ctx(t), c, s.k)
	if err != nil || rem["bj"] != 6 || rem["sh"] != 3 {
		t.Fatalf("remaining %v %v", rem, err)
	}
	u := userIn(1, 3, 0)
	if a := s.buyBucketed(u, 3, "sh"); a.Outcome != lua.Admitted {
		t.Fatalf("sh 3: %v", a.Outcome)
	}
	if a := s.buyBucketed(u, 1, "sh"); a.Outcome != lua.SoldOut {
		t.Fatalf("sh after 3: %v", a.Outcome)
	}
	for range 2 {
		if a := s.buyBucketed(u, 3, "bj"); a.Outcome != lua.Admitted {
			t.Fatalf("bj: %v", a.Outcome)
		}
	}
	rem, _ = lua.Remaining(ctx(t), c, s.k)
	if rem["bj"] != 0 || rem["sh"] != 0 {
		t.Fatalf("remaining %v", rem)
	}
}

// TestBucketRemainingAfterScriptLoss: a master that lost the function library
// (a restart without persistence, a failover to a fresh node) answers
// "Function not found" to the first view of a split sale; the retry, after
// the library is loaded again, sends the same keys in the same order, so
// every bucket's units are added to their own region. (The retry once listed
// the stock keys again, from a map: a bucket's bj and sh could swap, and the
// sale read bj 35 sh 25 instead of 40 and 20.) Deleting the Cluster's library
// is safe beside other tests: they run as a role that loads it again.
func TestBucketRemainingAfterScriptLoss(t *testing.T) {
	c := testenv.Redis(t, testenv.ClusterAddrs())
	s := newBucketed(t, c, 4, 60, func(sp *flashgate.Sale) {
		sp.Regions = map[string]int64{"bj": 40, "sh": 20}
		sp.PerUserLimit, sp.PerOrderMax = 2, 2
	})
	_, library := lua.Library()
	for i := range 20 {
		for addr, n := range c.Nodes() {
			if err := n.Do(ctx(t), n.B().FunctionDelete().LibraryName(library).Build()).Error(); err != nil && !strings.Contains(err.Error(), "not found") && !strings.HasPrefix(err.Error(), "READONLY") {
				t.Fatalf("function delete on %s: %v", addr, err)
			}
		}
		rem, err := lua.Remaining(ctx(t), c, s.k)
		if err != nil || rem["bj"] != 40 || rem["sh"] != 20 {
			t.Fatalf("round %d: remaining after the library was deleted = %v, %v; want bj 40 sh 20", i, rem, err)
		}
	}
}

// TestBucketReleaseReturnsHome: a release runs on the buyer's home bucket and
// its units can be bought again from any bucket.
func TestBucketReleaseReturnsHome(t *testing.T) {
	c := testenv.Redis(t, testenv.ClusterAddrs())
	s := newBucketed(t, c, 2, 2, nil)
	u := userIn(0, 2, 0)
	now := time.Now()
	a, err := scripts.AdmitBucketed(ctx(t), c, s.k, lua.AdmitArgs{User: u, Quantity: 2, OrderID: nextID(), Now: now, PayBy: now.Add(time.Minute)})
	if err != nil || a.Outcome != lua.Admitted {
		t.Fatalf("admit: %v %v", a.Outcome, err)
	}
	if b := s.buyBucketed(userIn(1, 2, 0), 1, ""); b.Outcome != lua.SoldOut {
		t.Fatalf("after all: %v", b.Outcome)
	}
	r, err := scripts.Release(ctx(t), c, s.k.Home(u), a.OrderID, "", "", lua.ReleaseGateway, "test")
	if err != nil || !r.Released {
		t.Fatalf("release: %+v %v", r, err)
	}
	if b := s.buyBucketed(userIn(1, 2, 0), 2, ""); b.Outcome != lua.Admitted {
		t.Fatalf("after the release: %v", b.Outcome)
	}
}

// TestBucketedExactUnderLoad: 1,200 units over 12 buckets, 12,000 buyers of
// 1-2 units (per_user_limit 2), concurrently, twice each: exactly 1,200 sold,
// no buyer over 2, nothing left in any bucket, no transfer half done, and no
// purchase admitted after one was told the sale is empty.
func TestBucketedExactUnderLoad(t *testing.T) {
	c := testenv.Redis(t, testenv.ClusterAddrs())
	const units, buyers = 1200, 12000
	s := newBucketed(t, c, 12, units, nil)
	var mu sync.Mutex
	sold, held := int64(0), map[string]int64{}
	// A sold-out answer with nothing left is what sets the gateways' mark:
	// no purchase begun after one may be admitted (the sale was not empty).
	var emptyAt time.Time
	late := 0
	var wg sync.WaitGroup
	jobs := make(chan int)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				u := "load-" + strconv.Itoa(i%buyers)
				q := int64(1 + i%2)
				now := time.Now()
				mu.Lock()
				after := !emptyAt.IsZero()
				mu.Unlock()
				a, err := scripts.AdmitBucketed(context.Background(), c, s.k, lua.AdmitArgs{User: u, Quantity: q,
					OrderID: nextID(), Now: now, PayBy: now.Add(time.Minute)})
				if err != nil {
					t.Error(err)
					continue // return would leave the feeder blocked for good
				}
				mu.Lock()
				switch {
				case a.Outcome == lua.Admitted:
					sold += q
					held[u] += q
					if after {
						late++
					}
				case a.Outcome == lua.SoldOut && a.Remaining == 0 && emptyAt.IsZero():
					emptyAt = time.Now()
				}
				mu.Unlock()
			}
		}()
	}
	for i := range 2 * buyers {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if sold != units {
		t.Errorf("sold %d of %d", sold, units)
	}
	if late != 0 {
		t.Errorf("%d purchases admitted after the sale answered sold out with nothing left", late)
	}
	for u, n := range held {
		if n > 2 {
			t.Errorf("%s holds %d", u, n)
		}
	}
	rem, err := lua.Remaining(ctx(t), c, s.k)
	if err != nil || rem[""] != 0 {
		t.Errorf("remaining %v %v", rem, err)
	}
	// Every transfer landed (its entry stays a while: docs/buckets.md).
	if n, err := lua.FinishTransfers(ctx(t), c, s.k); err != nil || n != 0 {
		t.Errorf("%d transfers left half done (%v)", n, err)
	}
	t.Logf("sold %d to %d buyers", sold, len(held))
}
