package backend

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// bucketMeta reads one field of every bucket's meta copy.
func bucketMeta(t *testing.T, s *started, k *lua.Keys, field string) []string {
	t.Helper()
	var out []string
	for _, b := range k.Buckets() {
		v, err := s.rc.Do(ctx(t), s.rc.B().Hget().Key(b.Meta).Field(field).Build()).ToString()
		if err != nil {
			t.Fatalf("bucket %d meta %s: %v", b.BucketIndex(), field, err)
		}
		out = append(out, v)
	}
	return out
}

// bucketStocks reads every bucket's stock.
func bucketStocks(t *testing.T, s *started, k *lua.Keys) []int64 {
	t.Helper()
	var out []int64
	for _, b := range k.Buckets() {
		key, _ := b.Stock("")
		n, err := s.rc.Do(ctx(t), s.rc.B().Get().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatalf("bucket %d stock: %v", b.BucketIndex(), err)
		}
		out = append(out, n)
	}
	return out
}

func allEqual(v []string, want string) bool {
	for _, x := range v {
		if x != want {
			return false
		}
	}
	return len(v) > 0
}

// userOfBucket is a user whose home is bucket i of k.
func userOfBucket(prefix string, i, k int) string {
	for j := 0; ; j++ {
		if u := prefix + strconv.Itoa(j); lua.HomeBucket(u, k) == i {
			return u
		}
	}
}

// TestSplitSaleUpdate: PATCH /admin/v1/sales/{sale} on a sale split over 4
// buckets on the Cluster, against MySQL and Redis. A lowering of the total
// takes free units from the buckets, fullest first, never reserved or sold
// ones; one that asks for more than the buckets hold free is refused with
// nothing changed; a refusal in a later bucket (a buyer there over the new
// per_user_limit) puts the spec back into the buckets already changed and the
// units already taken back into theirs; a raise is shared over the buckets;
// every bucket's meta copy and the sale's meta take the new spec; and the
// ledger (remaining + reserved + sold = total) holds after each step.
func TestSplitSaleUpdate(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.ClusterAddrs(), nil)
	tok := s.cfg.Admin.Token
	id := testenv.ID("splitupd")
	if status, body := s.call("POST", "/admin/v1/sales", tok, saleBody(id, 40, 3, `,"per_order_max":3,"buckets":4`)); status != 201 {
		t.Fatalf("create: %d %v", status, body)
	}
	row, err := loadSale(ctx(t), s.db, id)
	if err != nil || len(row.BucketTags) != 4 {
		t.Fatalf("MySQL: %+v %v", row, err)
	}
	t.Cleanup(func() { _, _ = lua.Retire(context.Background(), s.rc, &row.Sale) })
	k := lua.KeysOf(&row.Sale)
	path := "/admin/v1/sales/" + id
	ledger := func(what string, remaining, total int64) {
		t.Helper()
		status, body := s.call("GET", path, tok, "")
		inv, _ := body["invariant3"].(map[string]any)
		if status != 200 || inv["holds"] != true || body["remaining"] != float64(remaining) || body["total"] != float64(total) {
			t.Fatalf("%s: ledger %d %v, want remaining %d of total %d", what, status, body, remaining, total)
		}
	}

	// b1 (home: bucket 3) buys 3 units, written to MySQL; b2 (home: bucket
	// 1) holds 2 units reserved in Redis only.
	b1, b2 := userOfBucket("b1-", 3, 4), userOfBucket("b2-", 1, 4)
	m := admit(t, s.rc, k.Home(b1), b1, 3, "")
	s.publish(m)
	eventually(t, 10*time.Second, "b1's order", func() bool { return s.rows(id, "confirmed") == 1 })
	eventually(t, 5*time.Second, "b1's reservation settled", func() bool { return reservations(t, s.rc, k) == 0 })
	admit(t, s.rc, k.Home(b2), b2, 2, "")
	ledger("before", 35, 40)
	before := bucketStocks(t, s, k)
	if before[3] != 7 || before[1] != 8 {
		t.Fatalf("bucket stocks %v, want 10 each less b1's 3 (bucket 3) and b2's 2 (bucket 1)", before)
	}

	for _, tc := range []struct{ name, body, why string }{
		// MySQL's sold (3) allows it; Redis refuses: 35 units are free.
		{"total takes reserved units", `{"total":4}`, "35 units are left unreserved"},
		// MySQL knows b1's 3 units.
		{"limit below what MySQL counted", `{"per_user_limit":2,"per_order_max":2}`, "3 units a buyer already bought"},
	} {
		status, body := s.call("PATCH", path, tok, tc.body)
		if msg, _ := body["message"].(string); status != 409 || !strings.Contains(msg, tc.why) {
			t.Errorf("%s: %d %v, want 409 %q", tc.name, status, body, tc.why)
		}
	}
	if got := bucketStocks(t, s, k); !slices.Equal(got, before) {
		t.Fatalf("bucket stocks after refusals %v, want %v", got, before)
	}

	// A refusal only Redis can make, in a bucket after others: c2 (home:
	// bucket 2) holds 4 units reserved under a limit of 4, which MySQL does
	// not know (its most is b1's 3). Lowering the total by 10 and the limit
	// to 3 takes the 10 units, changes buckets 0 and 1, and bucket 2 refuses.
	if status, body := s.call("PATCH", path, tok, `{"per_user_limit":4}`); status != 200 || body["per_user_limit"] != float64(4) {
		t.Fatalf("raise per_user_limit: %d %v", status, body)
	}
	if got := bucketMeta(t, s, k, "limit"); !allEqual(got, "4") {
		t.Fatalf("bucket metas' limit after the raise: %v", got)
	}
	c2 := userOfBucket("c2-", 2, 4)
	admit(t, s.rc, k.Home(c2), c2, 3, "")
	admit(t, s.rc, k.Home(c2), c2, 1, "")
	ledger("c2 reserved 4", 31, 40)
	before = bucketStocks(t, s, k)
	status, body := s.call("PATCH", path, tok, `{"total":30,"per_user_limit":3}`)
	if msg, _ := body["message"].(string); status != 409 || !strings.Contains(msg, "per_user_limit 3") {
		t.Fatalf("a refusal in bucket 2: %d %v", status, body)
	}
	if got := bucketMeta(t, s, k, "limit"); !allEqual(got, "4") {
		t.Errorf("bucket metas' limit after the refusal: %v, want 4 everywhere (put back)", got)
	}
	if got := bucketStocks(t, s, k); !slices.Equal(got, before) {
		t.Errorf("bucket stocks after the refusal %v, want %v (the units taken put back)", got, before)
	}
	if sp, err := lua.LoadSale(ctx(t), s.rc, id); err != nil || sp.Total != 40 || sp.PerUserLimit != 4 {
		t.Errorf("sale meta after the refusal: %+v %v", sp, err)
	}
	ledger("after the refusal", 31, 40)

	// Lower the total by 25 (of 31 free): the fullest buckets give first,
	// none goes below 0, and each meta copy takes the new spec.
	future := time.Now().Add(3 * time.Hour).UTC().Truncate(time.Millisecond)
	status, body = s.call("PATCH", path, tok, `{"total":15,"per_order_max":2,"ends_at":"`+future.Format(time.RFC3339Nano)+`"}`)
	if status != 200 || body["total"] != float64(15) {
		t.Fatalf("lower the total: %d %v", status, body)
	}
	ledger("after lowering", 6, 15)
	var sum int64
	for i, n := range bucketStocks(t, s, k) {
		if n < 0 {
			t.Errorf("bucket %d stock %d", i, n)
		}
		sum += n
	}
	if sum != 6 {
		t.Errorf("bucket stocks sum %d, want 6", sum)
	}
	if got := bucketMeta(t, s, k, "omax"); !allEqual(got, "2") {
		t.Errorf("bucket metas' per_order_max: %v", got)
	}
	if got := bucketMeta(t, s, k, "ends"); !allEqual(got, strconv.FormatInt(future.UnixMilli(), 10)) {
		t.Errorf("bucket metas' ends: %v", got)
	}
	if got := bucketMeta(t, s, k, "total"); !allEqual(got, "15") {
		t.Errorf("bucket metas' total: %v", got)
	}
	// per_order_max 2 is what every bucket's admission checks now.
	for i := range 4 {
		u := userOfBucket("q", i, 4)
		now := time.Now()
		a, err := s.scripts.Admit(ctx(t), s.rc, k.Home(u), lua.AdmitArgs{User: u, Quantity: 3, OrderID: nextID.Add(1), Now: now, PayBy: now.Add(time.Minute)})
		if err != nil || a.Outcome != lua.BadQuantity {
			t.Errorf("bucket %d: 3 units after per_order_max 2: %v %v", i, a.Outcome, err)
		}
	}

	// Sell out what is left, then raise: the units come back in every bucket.
	for i := 0; remaining(t, s.rc, k, "") > 0; i++ {
		u := "d" + strconv.Itoa(i)
		if _, out := buy(t, s.env, k, u, 1, ""); out != lua.Admitted {
			t.Fatalf("buy %s: %v", u, out)
		}
	}
	ledger("sold out", 0, 15)
	status, body = s.call("PATCH", path, tok, `{"total":27}`)
	if status != 200 || body["total"] != float64(27) {
		t.Fatalf("raise the total: %d %v", status, body)
	}
	ledger("after the raise", 12, 27)
	for i, n := range bucketStocks(t, s, k) {
		if n != 3 {
			t.Errorf("bucket %d stock %d after the raise, want 3 (12 shared over 4)", i, n)
		}
	}
	if sp, err := lua.LoadSale(ctx(t), s.rc, id); err != nil || sp.Total != 27 || sp.PerOrderMax != 2 || !sp.EndsAt.Equal(future) {
		t.Errorf("sale meta after the raise: %+v %v", sp, err)
	}
	u := userOfBucket("e", 0, 4)
	if _, out := buy(t, s.env, k, u, 2, ""); out != lua.Admitted {
		t.Errorf("a buyer after the raise: %v", out)
	}
	ledger("a buyer after the raise", 10, 27)
}

// TestSaleUpdateRegions: PATCH with "regions" changes a live sale's units
// region by region (the total becomes their sum), on a sale of one tag and on
// one split over 4 buckets, against MySQL and the Cluster. Refused (409, the
// reason): a region below what it sold (MySQL), a lowering that would take
// reserved units (Redis), a region added or removed; a total that is not the
// regions' sum is a 400. Accepted: each
// region's stock moves by its own change, MySQL's region rows follow, and the
// ledger holds.
func TestSaleUpdateRegions(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.ClusterAddrs(), nil)
	tok := s.cfg.Admin.Token
	for _, buckets := range []int{1, 4} {
		t.Run("buckets="+strconv.Itoa(buckets), func(t *testing.T) {
			id := testenv.ID("regupd")
			extra := `,"per_order_max":5,"regions":{"a":10,"b":10},"buckets":` + strconv.Itoa(buckets)
			if status, body := s.call("POST", "/admin/v1/sales", tok, saleBody(id, 20, 5, extra)); status != 201 {
				t.Fatalf("create: %d %v", status, body)
			}
			row, err := loadSale(ctx(t), s.db, id)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = lua.Retire(context.Background(), s.rc, &row.Sale) })
			k := lua.KeysOf(&row.Sale)
			path := "/admin/v1/sales/" + id
			// x buys 2 in a (MySQL); y holds 2 reserved in b (Redis only).
			m := admit(t, s.rc, k.Home("x"), "x", 2, "a")
			s.publish(m)
			eventually(t, 10*time.Second, "x's order", func() bool { return s.rows(id, "confirmed") == 1 })
			eventually(t, 5*time.Second, "x's reservation settled", func() bool { return reservations(t, s.rc, k) == 0 })
			admit(t, s.rc, k.Home("y"), "y", 2, "b")

			for _, tc := range []struct {
				name, body string
				status     int
				why        string
			}{
				{"region below its sold", `{"regions":{"a":1,"b":10}}`, 409, "region a: 1 units is below the 2 sold there"},
				{"takes reserved units", `{"regions":{"a":10,"b":1}}`, 409, "8 units are left unreserved"},
				{"a region removed", `{"regions":{"a":10}}`, 409, "not be added or removed"},
				{"a region renamed", `{"regions":{"a":10,"c":10}}`, 409, `no region "c"`},
				{"a total alone", `{"total":25}`, 400, "regions add up to 20"},
				{"a total not the sum", `{"regions":{"a":5,"b":15},"total":21}`, 400, "not the sum"},
			} {
				status, body := s.call("PATCH", path, tok, tc.body)
				if msg, _ := body["message"].(string); status != tc.status || !strings.Contains(msg, tc.why) {
					t.Errorf("%s: %d %v, want %d %q", tc.name, status, body, tc.status, tc.why)
				}
			}
			rem, err := lua.Remaining(ctx(t), s.rc, k)
			if err != nil || rem["a"] != 8 || rem["b"] != 8 {
				t.Fatalf("Redis after the refusals: %v %v, want a 8, b 8", rem, err)
			}

			status, body := s.call("PATCH", path, tok, `{"regions":{"a":5,"b":15}}`)
			if status != 200 || body["total"] != float64(20) {
				t.Fatalf("update: %d %v", status, body)
			}
			rem, err = lua.Remaining(ctx(t), s.rc, k)
			if err != nil || rem["a"] != 3 || rem["b"] != 13 {
				t.Fatalf("Redis after the update: %v %v, want a 3, b 13", rem, err)
			}
			row, err = loadSale(ctx(t), s.db, id)
			if err != nil || row.Regions["a"] != 5 || row.Regions["b"] != 15 || row.Total != 20 {
				t.Fatalf("MySQL after the update: %+v %v", row, err)
			}
			if sp, err := lua.LoadSale(ctx(t), s.rc, id); err != nil || sp.Regions["a"] != 5 || sp.Regions["b"] != 15 {
				t.Fatalf("Redis meta after the update: %+v %v", sp, err)
			}
			status, body = s.call("GET", path, tok, "")
			inv, _ := body["invariant3"].(map[string]any)
			if status != 200 || inv["holds"] != true || body["remaining"] != float64(16) {
				t.Fatalf("ledger: %d %v", status, body)
			}
			// Region a's last 3 units sell; a fourth does not.
			if _, out := buy(t, s.env, k, "z1", 3, "a"); out != lua.Admitted {
				t.Fatalf("buy a's last 3: %v", out)
			}
			if _, out := buy(t, s.env, k, "z2", 1, "a"); out != lua.SoldOut {
				t.Fatalf("buy past a's units: %v", out)
			}
		})
	}
}
