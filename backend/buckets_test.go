package backend

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// createSplitSale writes a sale of k buckets (tags from the Cluster's slot
// map) to MySQL, warms it, and answers its keys.
func (e *env) createSplitSale(s *flashgate.Sale, k int) *lua.Keys {
	e.t.Helper()
	var err error
	s.Buckets = k
	if s.BucketTags, err = lua.ChooseBucketTags(ctx(e.t), e.rc, s.ID, k); err != nil {
		e.t.Fatal(err)
	}
	if err := s.Validate(); err != nil {
		e.t.Fatal(err)
	}
	if err := insertSale(ctx(e.t), e.db, s, time.Now().UTC()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = lua.Retire(c, e.rc, s)
	})
	if did, err := e.warmer.warm(ctx(e.t), s.ID); err != nil || !did {
		e.t.Fatalf("warm %s: did=%v err=%v", s.ID, did, err)
	}
	return lua.KeysOf(s)
}

// buy admits one purchase on a split sale as a gateway does.
func buy(t *testing.T, e *env, k *lua.Keys, user string, qty int64, region string) (flashgate.Order, lua.Outcome) {
	t.Helper()
	now := time.Now()
	a := lua.AdmitArgs{User: user, Quantity: qty, OrderID: nextID.Add(1), Now: now, Region: region, PayBy: now.Add(15 * time.Minute)}
	got, err := e.scripts.AdmitBucketed(ctx(t), e.rc, k, a)
	if err != nil {
		t.Fatalf("admit: %v", err)
	}
	return flashgate.Order{ID: got.OrderID, SaleID: k.Sale, UserID: user, Quantity: qty, Region: region, Status: flashgate.OrderPending,
		CreatedAt: ms(now.UnixMilli()), ExpiresAt: ms(a.PayBy.UnixMilli())}, got.Outcome
}

// TestSplitSaleWriteWarmReconcile: a sale of 4 buckets with two regions on
// the Cluster. Orders written to MySQL are confirmed in their buyers' home
// buckets; after Redis lost everything the warm brings each buyer's count
// back to their home bucket (a buyer at the limit stays there); a drifted
// stock is repaired bucket by bucket to exactly MySQL's figure; and then
// every unit left sells.
func TestSplitSaleWriteWarmReconcile(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.ClusterAddrs())
	r := idleBackend(t, e)
	sale := spec(60, 2, map[string]int64{"bj": 40, "sh": 20})
	k := e.createSplitSale(sale, 4)
	if rem, err := lua.Remaining(ctx(t), e.rc, k); err != nil || rem["bj"] != 40 || rem["sh"] != 20 {
		t.Fatalf("warm: %v %v", rem, err)
	}
	var orders []flashgate.Order
	for i, u := range []string{"u1", "u2", "u3"} {
		region := "bj"
		if i == 2 {
			region = "sh"
		}
		o, out := buy(t, e, k, u, 2, region)
		if out != lua.Admitted {
			t.Fatalf("%s: %v", u, out)
		}
		orders = append(orders, o)
	}
	for _, o := range e.process(sale.ID, orders) {
		if o.Status != flashgate.OrderConfirmed {
			t.Fatalf("outcome %+v", o)
		}
	}
	for _, o := range orders {
		rec, ok, err := lua.Order(ctx(t), e.rc, k.Home(o.UserID), o.ID)
		if err != nil || !ok || rec.Status != flashgate.OrderConfirmed {
			t.Fatalf("order %d in its home bucket: %+v %v %v", o.ID, rec, ok, err)
		}
	}

	// Redis loses the sale; the warm rebuilds it from MySQL.
	if _, err := lua.Retire(ctx(t), e.rc, sale); err != nil {
		t.Fatal(err)
	}
	if did, err := e.warmer.warm(ctx(t), sale.ID); err != nil || !did {
		t.Fatalf("rewarm: %v %v", did, err)
	}
	if _, out := buy(t, e, k, "u1", 1, "bj"); out != lua.LimitReached {
		t.Fatalf("u1 after the warm: %v, want limit_reached (its count in its home bucket)", out)
	}
	if rem, _ := lua.Remaining(ctx(t), e.rc, k); rem["bj"] != 36 || rem["sh"] != 18 {
		t.Fatalf("after the warm: %v", rem)
	}

	// Drift: one bucket gains 5 units of bj, another loses 3 of sh.
	b := k.Buckets()
	bj, _ := b[1].Stock("bj")
	sh, _ := b[2].Stock("sh")
	for _, cmd := range []struct {
		key string
		n   int64
	}{{bj, 5}, {sh, -3}} {
		if err := e.rc.Do(ctx(t), e.rc.B().Incrby().Key(cmd.key).Increment(cmd.n).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	rep := reconcileNow(t, r, sale.ID, ReconcileOptions{})
	if !rep.Repair.Done || !rep.Invariant3Holds {
		t.Fatalf("repair: %+v", rep)
	}
	if rem, _ := lua.Remaining(ctx(t), e.rc, k); rem["bj"] != 36 || rem["sh"] != 18 {
		t.Fatalf("after the repair: %v", rem)
	}

	// A master loses u1's home bucket (its meta, stock and buyers'
	// records), the sale's own meta stays: reconcile refills the bucket
	// (its buyers' counts from MySQL) and the repair gives its units back.
	lost := k.Home("u1")
	_, lostStock := lost.StockKeys()
	if err := e.rc.Do(ctx(t), e.rc.B().Del().Key(append([]string{lost.Meta, lost.Users, lost.Orders, lost.Idem, lost.Resv}, lostStock...)...).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	rep = reconcileNow(t, r, sale.ID, ReconcileOptions{})
	if !rep.Rewarmed || !rep.Invariant3Holds {
		t.Fatalf("after losing a bucket: %+v", rep)
	}
	if rem, _ := lua.Remaining(ctx(t), e.rc, k); rem["bj"] != 36 || rem["sh"] != 18 {
		t.Fatalf("after the refill: %v", rem)
	}
	for _, o := range orders {
		if k.Home(o.UserID) != lost {
			continue
		}
		if _, out := buy(t, e, k, o.UserID, 1, o.Region); out != lua.LimitReached {
			t.Fatalf("%s (home lost and refilled): %v, want limit_reached", o.UserID, out)
		}
	}

	// Every unit left sells, to buyers of every bucket.
	sold := map[string]int64{}
	for i := 0; sold["bj"] < 36 || sold["sh"] < 18; i++ {
		if i > 200 {
			t.Fatalf("sold %v of 36 bj and 18 sh", sold)
		}
		region := "bj"
		if sold["bj"] >= 36 {
			region = "sh"
		}
		if _, out := buy(t, e, k, "n"+strconv.Itoa(i), 2, region); out == lua.Admitted {
			sold[region] += 2
		} else {
			t.Fatalf("buyer %d in %s after %v sold: %v", i, region, sold, out)
		}
	}
	for _, region := range []string{"bj", "sh"} {
		if _, out := buy(t, e, k, "late-"+region, 1, region); out != lua.SoldOut {
			t.Fatalf("%s after everything: %v", region, out)
		}
	}
}

// TestRepairAndWarmTakeTurns: the warm (and the refill of a split sale's
// lost buckets) and the stock repair are the writers of a sale's stock keys
// from MySQL; they hold the sale's warm lock in turn. A repair that finds the
// lock held sets nothing; one that finds a bucket lost leaves it to the
// refill; and a repair and a refill run at once, over and over, always end
// with every region's units where MySQL says, none moved to another region.
func TestRepairAndWarmTakeTurns(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.ClusterAddrs())
	r := idleBackend(t, e)
	sale := spec(60, 2, map[string]int64{"bj": 40, "sh": 20})
	k := e.createSplitSale(sale, 4)
	b := k.Buckets()
	drift := func() {
		t.Helper()
		key, _ := b[1].Stock("bj")
		if err := e.rc.Do(ctx(t), e.rc.B().Incrby().Key(key).Increment(5).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	want := func(when string, bj, sh int64) {
		t.Helper()
		if rem, err := lua.Remaining(ctx(t), e.rc, k); err != nil || rem["bj"] != bj || rem["sh"] != sh {
			t.Fatalf("%s: remaining %v %v, want bj %d sh %d", when, rem, err, bj, sh)
		}
	}

	// A warm holds the lock: the repair waits for it.
	drift()
	lock := warmLockKey(sale.ID)
	if err := e.rc.Do(ctx(t), e.rc.B().Set().Key(lock).Value("another-warmer").Px(warmLockTTL).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	rep := reconcileNow(t, r, sale.ID, ReconcileOptions{})
	if rep.Repair.Done || rep.Repair.Skipped != warmUnderWay {
		t.Fatalf("repair beside a warm: %+v, want skipped (%s)", rep.Repair, warmUnderWay)
	}
	want("after the skipped repair", 45, 20)
	if err := e.rc.Do(ctx(t), e.rc.B().Del().Key(lock).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if rep := reconcileNow(t, r, sale.ID, ReconcileOptions{}); !rep.Repair.Done || !rep.Invariant3Holds {
		t.Fatalf("repair once the warm is done: %+v", rep)
	}
	want("after the repair", 40, 20)

	// A bucket lost (its meta gone): the sale is rebuilt, every bucket of it.
	drift()
	if err := e.rc.Do(ctx(t), e.rc.B().Del().Key(b[2].Meta).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if rep := reconcileNow(t, r, sale.ID, ReconcileOptions{}); !rep.Rewarmed || !rep.Invariant3Holds {
		t.Fatalf("rebuild: %+v", rep)
	}
	want("after the rebuild", 40, 20)

	// A master loses a bucket while one backend refills it and another
	// repairs the sale, again and again.
	for i := range 20 {
		drift()
		lost := b[i%len(b)]
		_, stock := lost.StockKeys()
		if err := e.rc.Do(ctx(t), e.rc.B().Del().Key(append([]string{lost.Meta}, stock...)...).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := e.warmer.warm(ctx(t), sale.ID)
			done <- err
		}()
		if _, err := r.ReconcileWith(ctx(t), sale.ID, ReconcileOptions{}); err != nil {
			t.Fatalf("round %d: reconcile: %v", i, err)
		}
		if err := <-done; err != nil {
			t.Fatalf("round %d: warm: %v", i, err)
		}
		// Whichever went first, the next repair finds every bucket warm.
		rep := reconcileNow(t, r, sale.ID, ReconcileOptions{})
		if !rep.Invariant3Holds {
			t.Fatalf("round %d: %+v", i, rep)
		}
		want("round "+strconv.Itoa(i), 40, 20)
	}
}

// TestAdminCreatesSplitSale: POST /admin/v1/sales with "buckets": 12 on the
// Cluster stores twelve tags, four per master; GET shows them, a PATCH
// changes it, the ledger counts every bucket, and a close ends admissions in
// every bucket.
func TestAdminCreatesSplitSale(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.ClusterAddrs(), nil)
	tok := s.cfg.Admin.Token
	id := testenv.ID("split")
	status, body := s.call("POST", "/admin/v1/sales", tok, saleBody(id, 120, 2, `,"buckets":12`))
	if status != 201 || body["buckets"] != float64(12) {
		t.Fatalf("create: %d %v", status, body)
	}
	tags, _ := body["bucket_tags"].([]any)
	if len(tags) != 12 {
		t.Fatalf("bucket tags: %v", body["bucket_tags"])
	}
	row, err := loadSale(ctx(t), s.db, id)
	if err != nil || len(row.BucketTags) != 12 {
		t.Fatalf("MySQL: %+v %v", row, err)
	}
	t.Cleanup(func() { _, _ = lua.Retire(context.Background(), s.rc, &row.Sale) })
	k := lua.KeysOf(&row.Sale)
	slots, err := s.rc.Do(ctx(t), s.rc.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	perMaster := map[int64]int{}
	for _, b := range k.Buckets() {
		sl := int64(lua.Slot(b.Meta))
		for _, r := range slots {
			v, _ := r.ToArray()
			lo, _ := v[0].AsInt64()
			hi, _ := v[1].AsInt64()
			if sl >= lo && sl <= hi {
				node, _ := v[2].ToArray()
				port, _ := node[1].AsInt64()
				perMaster[port]++
			}
		}
	}
	if len(perMaster) != 3 {
		t.Fatalf("buckets per master: %v", perMaster)
	}
	for port, n := range perMaster {
		if n != 4 {
			t.Errorf("master %d holds %d buckets, want 4", port, n)
		}
	}
	// A split sale changes in place like any other (TestSplitSaleUpdate).
	if status, body := s.call("PATCH", "/admin/v1/sales/"+id, tok, `{"per_user_limit":3}`); status != 200 || body["per_user_limit"] != float64(3) {
		t.Errorf("patch of a split sale: %d %v, want 200", status, body)
	}
	status, body = s.call("GET", "/admin/v1/sales/"+id, tok, "")
	inv, _ := body["invariant3"].(map[string]any)
	if status != 200 || body["remaining"] != float64(120) || inv["holds"] != true {
		t.Fatalf("ledger: %d %v", status, body)
	}
	if status, _ := s.call("POST", "/admin/v1/sales/"+id+"/close", tok, ""); status != 200 {
		t.Fatalf("close: %d", status)
	}
	for i, b := range k.Buckets() {
		now := time.Now()
		u := "u"
		for j := 0; lua.HomeBucket(u, 12) != i; j++ {
			u = "u" + strconv.Itoa(j)
		}
		a, err := s.scripts.Admit(ctx(t), s.rc, b, lua.AdmitArgs{User: u, Quantity: 1, OrderID: nextID.Add(1), Now: now, PayBy: now.Add(time.Minute)})
		if err != nil || a.Outcome != lua.Ended {
			t.Errorf("bucket %d after the close: %v %v", i, a.Outcome, err)
		}
	}
}
