package lua_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

var scripts = lua.Load()

// lastID hands out order ids; they only need to be unique within one sale.
var lastID atomic.Uint64

func nextID() uint64 { return lastID.Add(1) }

func init() { lastID.Store(uint64(time.Now().UnixNano())) }

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// sale is one warmed test sale on one Redis.
type sale struct {
	t    testing.TB
	c    rueidis.Client
	spec *flashgate.Sale
	k    *lua.Keys
}

// newSale warms a sale of 10 units (limit 2, at most 2 per order) that started a
// minute ago and ends in an hour; edit changes the spec before warming.
func newSale(t testing.TB, c rueidis.Client, edit func(*flashgate.Sale)) *sale {
	t.Helper()
	base := time.Now().Truncate(time.Millisecond)
	spec := &flashgate.Sale{
		ID: testenv.ID("lua"), Title: "test sale", PriceCents: 999, Total: 10,
		StartsAt: base.Add(-time.Minute), EndsAt: base.Add(time.Hour),
		PerUserLimit: 2, PerOrderMax: 2,
	}
	if edit != nil {
		edit(spec)
	}
	if err := spec.Validate(); err != nil {
		t.Fatalf("spec: %v", err)
	}
	remaining := map[string]int64{"": spec.Total}
	if len(spec.Regions) > 0 {
		remaining = spec.Regions
	}
	s := &sale{t: t, c: c, spec: spec, k: lua.KeysFor(spec.ID, spec.RegionNames())}
	t.Cleanup(s.drop)
	warmed, err := scripts.Warm(ctx(t), c, spec, remaining)
	if err != nil || !warmed {
		t.Fatalf("warm %s: %v, %v", spec.ID, warmed, err)
	}
	return s
}

func (s *sale) drop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, stock := s.k.StockKeys()
	keys := append([]string{s.k.Meta, s.k.Users, s.k.Resv, s.k.Orders, s.k.Idem}, stock...)
	for _, key := range keys {
		_ = s.c.Do(ctx, s.c.B().Del().Key(key).Build()).Error()
	}
	_ = s.c.Do(ctx, s.c.B().Srem().Key(lua.SalesIndex).Member(s.spec.ID).Build()).Error()
}

// admitErr fills what a gateway would: an order id, now, a payment deadline.
func (s *sale) admitErr(a lua.AdmitArgs) (lua.Admission, lua.AdmitArgs, error) {
	if a.OrderID == 0 {
		a.OrderID = nextID()
	}
	if a.Now.IsZero() {
		a.Now = time.Now()
	}
	if a.PayBy.IsZero() {
		a.PayBy = a.Now.Add(15 * time.Minute)
	}
	if a.Quantity == 0 {
		a.Quantity = 1
	}
	res, err := scripts.Admit(ctx(s.t), s.c, s.k, a)
	if err == nil && res.Outcome == lua.Admitted {
		// The record's created time is Redis's clock at the admission, and
		// its deadline as far from it as the caller's.
		a.PayBy = res.At.Add(a.PayBy.Sub(a.Now))
		a.Now = res.At
	}
	return res, a, err
}

func (s *sale) admit(a lua.AdmitArgs) (lua.Admission, lua.AdmitArgs) {
	s.t.Helper()
	res, a, err := s.admitErr(a)
	if err != nil {
		s.t.Fatalf("admit %+v: %v", a, err)
	}
	return res, a
}

// mustAdmit admits and fails the test unless the outcome is Admitted.
func (s *sale) mustAdmit(a lua.AdmitArgs) (uint64, lua.AdmitArgs) {
	s.t.Helper()
	res, a := s.admit(a)
	if res.Outcome != lua.Admitted || res.OrderID != a.OrderID {
		s.t.Fatalf("admit %+v = %+v, want admitted with id %d", a, res, a.OrderID)
	}
	return res.OrderID, a
}

func (s *sale) remaining(region string) int64 {
	s.t.Helper()
	m, err := lua.Remaining(ctx(s.t), s.c, s.k)
	if err != nil {
		s.t.Fatal(err)
	}
	n, ok := m[region]
	if !ok {
		s.t.Fatalf("remaining %v: no region %q", m, region)
	}
	return n
}

func (s *sale) held(user string) int64 {
	s.t.Helper()
	v, err := s.c.Do(ctx(s.t), s.c.B().Hget().Key(s.k.Users).Field(user).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0
	}
	if err != nil {
		s.t.Fatal(err)
	}
	return v
}

// resv is the sale's reservations, each as its record holds it: without the
// id and sale, which are the hash's field and key (lua.Reservations fills them).
func (s *sale) resv() map[uint64]flashgate.Order {
	s.t.Helper()
	m, err := lua.Reservations(ctx(s.t), s.c, s.k)
	if err != nil {
		s.t.Fatal(err)
	}
	for id, o := range m {
		if o.ID != id || o.SaleID != s.k.Sale {
			s.t.Fatalf("reservation %d read as order %d of sale %q", id, o.ID, o.SaleID)
		}
		o.ID, o.SaleID = 0, ""
		m[id] = o
	}
	return m
}

// order is the order's record, as resv.
func (s *sale) order(id uint64) (flashgate.Order, bool) {
	s.t.Helper()
	r, ok, err := lua.Order(ctx(s.t), s.c, s.k, id)
	if err != nil {
		s.t.Fatal(err)
	}
	if ok && (r.ID != id || r.SaleID != s.k.Sale) {
		s.t.Fatalf("order %d read as order %d of sale %q", id, r.ID, r.SaleID)
	}
	r.ID, r.SaleID = 0, ""
	return r, ok
}

// settled is rec with MySQL's outcome, for Confirm.
func settled(id uint64, st flashgate.OrderStatus, rec flashgate.Order) flashgate.Order {
	rec.ID, rec.Status = id, st
	return rec
}

// restocking is rec canceled by MySQL with reason, for Restock.
func restocking(id uint64, st flashgate.OrderStatus, reason string, rec flashgate.Order) flashgate.Order {
	rec.ID, rec.Status, rec.Reason = id, st, reason
	return rec
}

// ms is a record's time: Unix milliseconds, in UTC.
func ms(v int64) time.Time { return time.UnixMilli(v).UTC() }

func (s *sale) release(id uint64, region, mode, reason string) lua.ReleaseResult {
	s.t.Helper()
	r, err := scripts.Release(ctx(s.t), s.c, s.k, id, region, "", mode, reason)
	if err != nil {
		s.t.Fatalf("release %d: %v", id, err)
	}
	return r
}

func (s *sale) claim(ids ...uint64) []lua.ClaimStatus {
	s.t.Helper()
	out, err := scripts.Claim(ctx(s.t), s.c, s.k, ids)
	if err != nil {
		s.t.Fatalf("claim %v: %v", ids, err)
	}
	return out
}

// record is what admit should have stored for a.
func record(status flashgate.OrderStatus, a lua.AdmitArgs) flashgate.Order {
	return flashgate.Order{Status: status, UserID: a.User, Quantity: a.Quantity, Region: a.Region,
		CreatedAt: ms(a.Now.UnixMilli()), ExpiresAt: ms(a.PayBy.UnixMilli()), IdemKey: a.IdemKey}
}

// eachTarget runs fn against the standalone Redis and the Cluster.
func eachTarget(t *testing.T, fn func(t *testing.T, c rueidis.Client)) {
	for _, target := range testenv.RedisTargets(t) {
		t.Run(target.Name, func(t *testing.T) { fn(t, target.Client) })
	}
}

func TestKeysShareHashTag(t *testing.T) {
	k := lua.KeysFor("s1", []string{"bj", "sh"})
	_, stock := k.StockKeys()
	keys := append([]string{k.Meta, k.Users, k.Resv, k.Orders, k.Idem}, stock...)
	if len(keys) != 7 {
		t.Fatalf("keys %v", keys)
	}
	seen := map[string]bool{}
	for _, key := range keys {
		if !strings.HasPrefix(key, "fg:{s:s1}:") {
			t.Errorf("key %q lacks the hash tag {s:s1}", key)
		}
		if seen[key] {
			t.Errorf("key %q twice", key)
		}
		seen[key] = true
	}
	if _, ok := k.Stock(""); ok {
		t.Error(`Stock("") of a regional sale: ok`)
	}
	if _, ok := k.Stock("gz"); ok {
		t.Error(`Stock("gz"): ok`)
	}
	plain := lua.KeysFor("s1", nil)
	if key, ok := plain.Stock(""); !ok || key != "fg:{s:s1}:stock" {
		t.Errorf(`Stock("") = %q, %v`, key, ok)
	}
	if _, ok := plain.Stock("bj"); ok {
		t.Error(`Stock("bj") of a sale without regions: ok`)
	}
}

func TestOutcomeString(t *testing.T) {
	for o, want := range map[lua.Outcome]string{
		lua.Admitted: "ok", lua.Replayed: "replay", lua.NotWarmed: "not_warmed", lua.NotStarted: "not_started",
		lua.Ended: "ended", lua.BadQuantity: "bad_quantity", lua.LimitReached: "limit_reached",
		lua.SoldOut: "sold_out", lua.DuplicateID: "duplicate_id", 0: "", 42: "outcome(42)",
	} {
		if got := o.String(); got != want {
			t.Errorf("Outcome(%d) = %q, want %q", o, got, want)
		}
	}
}

func TestDecodeRecords(t *testing.T) {
	good := "pending|why|u1|2|bj|1000|2000|k1"
	r, err := lua.DecodeRecord("s", 7, good)
	want := flashgate.Order{ID: 7, SaleID: "s", Status: "pending", Reason: "why", UserID: "u1", Quantity: 2, Region: "bj",
		CreatedAt: ms(1000), ExpiresAt: ms(2000), IdemKey: "k1"}
	if err != nil || r != want {
		t.Fatalf("DecodeRecord(%q) = %+v, %v", good, r, err)
	}
	r, err = lua.DecodeResv("s", 7, "u1|2|bj|1000|2000|k1")
	want.Reason = ""
	if err != nil || r != want {
		t.Fatalf("DecodeResv = %+v, %v", r, err)
	}
	for _, bad := range []string{"", "pending", "a|b|c|d|e|f|g", "a|b|c|d|e|f|g|h|i",
		"pending||u|x|bj|1|2|k", "pending||u|1|bj|x|2|k", "pending||u|1|bj|1|x|k"} {
		if _, err := lua.DecodeRecord("s", 7, bad); err == nil {
			t.Errorf("DecodeRecord(%q): no error", bad)
		}
	}
}

func TestAdmitted(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, nil)
		id, a := s.mustAdmit(lua.AdmitArgs{User: "alice", Quantity: 2, IdemKey: "k-1"})
		res, b := s.admit(lua.AdmitArgs{User: "bob", Quantity: 1})
		if res.Outcome != lua.Admitted || res.Remaining != 7 {
			t.Fatalf("second admit = %+v, want admitted with 7 left", res)
		}
		if got := s.remaining(""); got != 7 {
			t.Errorf("remaining = %d, want 7", got)
		}
		if got := s.held("alice"); got != 2 {
			t.Errorf("alice holds %d, want 2", got)
		}
		if got := s.held("bob"); got != 1 {
			t.Errorf("bob holds %d, want 1", got)
		}
		rec, ok := s.order(id)
		if want := record("pending", a); !ok || rec != want {
			t.Errorf("order %d = %+v, %v; want %+v", id, rec, ok, want)
		}
		resv := s.resv()
		if len(resv) != 2 || resv[id] != record("pending", a) || resv[res.OrderID] != record("pending", b) {
			t.Errorf("reservations = %+v", resv)
		}
	})
}

// TestDuplicateOrderIDChangesNothing: an order id met twice must not overwrite
// the first reservation (its unit would vanish from the ledger).
func TestDuplicateOrderIDChangesNothing(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, nil)
		id, _ := s.mustAdmit(lua.AdmitArgs{User: "alice", Quantity: 1})
		res, _ := s.admit(lua.AdmitArgs{User: "bob", Quantity: 2, OrderID: id})
		if res.Outcome != lua.DuplicateID {
			t.Fatalf("second admission with id %d = %+v, want duplicate_id", id, res)
		}
		rem, err := lua.Remaining(ctx(t), c, s.k)
		if err != nil || rem[""] != 9 {
			t.Fatalf("remaining %v %v, want 9: the duplicate moved stock", rem, err)
		}
		resv, _ := lua.Reservations(ctx(t), c, s.k)
		if r := resv[id]; len(resv) != 1 || r.UserID != "alice" || r.Quantity != 1 {
			t.Fatalf("reservations %+v: the first one was overwritten", resv)
		}
	})
}

func TestReplayed(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, func(s *flashgate.Sale) { s.PerUserLimit = 4 })
		id, _ := s.mustAdmit(lua.AdmitArgs{User: "alice", Quantity: 2, IdemKey: "key"})
		for i := 0; i < 3; i++ {
			res, _ := s.admit(lua.AdmitArgs{User: "alice", Quantity: 2, IdemKey: "key"})
			if res.Outcome != lua.Replayed || res.OrderID != id {
				t.Fatalf("replay %d = %+v, want replayed %d", i, res, id)
			}
		}
		// A replay is answered whatever the body says now: the first decision stands.
		if res, _ := s.admit(lua.AdmitArgs{User: "alice", Quantity: 1, IdemKey: "key"}); res.Outcome != lua.Replayed || res.OrderID != id {
			t.Fatalf("replay with another quantity = %+v", res)
		}
		if got, held := s.remaining(""), s.held("alice"); got != 8 || held != 2 || len(s.resv()) != 1 {
			t.Fatalf("after replays: remaining %d, alice holds %d, %d reservations", got, held, len(s.resv()))
		}
		// The key belongs to the user: another user with it is a new admission.
		other, _ := s.mustAdmit(lua.AdmitArgs{User: "bob", Quantity: 1, IdemKey: "key"})
		if other == id {
			t.Fatal("bob got alice's order")
		}
		// Without a key, or with another key, alice buys again.
		s.mustAdmit(lua.AdmitArgs{User: "alice", Quantity: 1})
		s.mustAdmit(lua.AdmitArgs{User: "alice", Quantity: 1, IdemKey: "key2"})
		if got := s.remaining(""); got != 5 {
			t.Fatalf("remaining = %d, want 5", got)
		}
		// A replay after the sale closed still answers the order it made.
		if err := lua.Close(ctx(t), c, s.k); err != nil {
			t.Fatal(err)
		}
		if res, _ := s.admit(lua.AdmitArgs{User: "alice", IdemKey: "key"}); res.Outcome != lua.Replayed || res.OrderID != id {
			t.Fatalf("replay after close = %+v", res)
		}
	})
}

// TestIdemKnown: the read that lets a keyed purchase past a sold-out mark
// says "known" for a key used before and for a sale Redis has lost (it may
// have lost the key too: the admission then answers not_warmed, never a
// sold-out that forgets the first order), and "unknown" only for a new key on
// a warm sale.
func TestIdemKnown(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, nil)
		s.mustAdmit(lua.AdmitArgs{User: "alice", Quantity: 1, IdemKey: "key"})
		for _, tc := range []struct {
			user, key string
			want      bool
		}{{"alice", "key", true}, {"alice", "other", false}, {"bob", "key", false}} {
			if got, err := lua.IdemKnown(ctx(t), c, s.k, tc.user, tc.key); err != nil || got != tc.want {
				t.Fatalf("warm sale, %s/%s: known %v (%v), want %v", tc.user, tc.key, got, err, tc.want)
			}
		}
		cold := lua.KeysFor(testenv.ID("cold"), nil)
		if got, err := lua.IdemKnown(ctx(t), c, cold, "alice", "new"); err != nil || !got {
			t.Fatalf("cold sale: known %v (%v), want true (the admission decides)", got, err)
		}
	})
}

func TestNotWarmed(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		t.Run("no meta", func(t *testing.T) {
			k := lua.KeysFor(testenv.ID("cold"), nil)
			res, err := scripts.Admit(ctx(t), c, k, lua.AdmitArgs{User: "u", Quantity: 1, OrderID: nextID(), Now: time.Now()})
			if err != nil || res.Outcome != lua.NotWarmed {
				t.Fatalf("admit = %+v, %v; want not warmed", res, err)
			}
			n, err := c.Do(ctx(t), c.B().Exists().Key(k.Users, k.Resv, k.Orders).Build()).AsInt64()
			if err != nil || n != 0 {
				t.Fatalf("admit on a cold sale wrote %d keys (%v)", n, err)
			}
		})
		t.Run("no stock key", func(t *testing.T) {
			s := newSale(t, c, func(s *flashgate.Sale) { s.Regions = map[string]int64{"bj": 6, "sh": 4} })
			sh, _ := s.k.Stock("sh")
			if err := c.Do(ctx(t), c.B().Del().Key(sh).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			res, _ := s.admit(lua.AdmitArgs{User: "u", Region: "sh"})
			if res.Outcome != lua.NotWarmed {
				t.Fatalf("admit = %+v, want not warmed (never sold out)", res)
			}
			if s.held("u") != 0 || len(s.resv()) != 0 {
				t.Fatal("a not-warmed admission counted the user or reserved")
			}
			// The other region is unaffected.
			s.mustAdmit(lua.AdmitArgs{User: "u", Region: "bj"})
		})
	})
}

// TestWindow: the sale window is judged by Redis's clock (TIME), whatever
// the caller's now says: a sale starting in 10 minutes is not started, with
// the wait to its start by Redis's clock, even for a caller whose clock says
// it started; one that started is open even for a caller whose clock says it
// has not; one that ended is ended. Refusals move no stock.
func TestWindow(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		base := time.Now().Truncate(time.Millisecond)
		later := newSale(t, c, func(s *flashgate.Sale) { s.StartsAt, s.EndsAt = base.Add(10*time.Minute), base.Add(70*time.Minute) })
		open := newSale(t, c, nil)
		ended := newSale(t, c, func(s *flashgate.Sale) { s.StartsAt, s.EndsAt = base.Add(-time.Hour), base.Add(-time.Second) })
		for _, tc := range []struct {
			name string
			s    *sale
			now  time.Time // the caller's clock: decides nothing
			want lua.Outcome
		}{
			{"not started", later, base, lua.NotStarted},
			{"not started, the caller's clock past the start", later, base.Add(11 * time.Minute), lua.NotStarted},
			{"open", open, base, lua.Admitted},
			{"open, the caller's clock before the start", open, base.Add(-2 * time.Minute), lua.Admitted},
			{"open, the caller's clock past the end", open, base.Add(2 * time.Hour), lua.Admitted},
			{"ended", ended, base, lua.Ended},
			{"ended, the caller's clock inside the window", ended, base.Add(-time.Minute), lua.Ended},
		} {
			t.Run(tc.name, func(t *testing.T) {
				before := tc.s.remaining("")
				res, _ := tc.s.admit(lua.AdmitArgs{User: testenv.ID("u"), Now: tc.now})
				if res.Outcome != tc.want {
					t.Fatalf("admit with the caller's clock at %v = %+v, want %v", tc.now, res, tc.want)
				}
				if tc.want == lua.NotStarted && (res.Wait <= 9*time.Minute || res.Wait > 10*time.Minute) {
					t.Fatalf("wait %v, want the time to the start by Redis's clock (about 10m)", res.Wait)
				}
				if tc.want != lua.Admitted && tc.s.remaining("") != before {
					t.Fatal("a refusal moved stock")
				}
			})
		}
	})
}

func TestClosed(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, nil)
		s.mustAdmit(lua.AdmitArgs{User: "u1"})
		if err := lua.Close(ctx(t), c, s.k); err != nil {
			t.Fatal(err)
		}
		res, _ := s.admit(lua.AdmitArgs{User: "u2"})
		if res.Outcome != lua.Ended {
			t.Fatalf("admit after close = %+v, want ended", res)
		}
		if got := s.remaining(""); got != 9 {
			t.Fatalf("remaining = %d, want 9", got)
		}
		loaded, err := lua.LoadSale(ctx(t), c, s.spec.ID)
		if err != nil || !loaded.Closed {
			t.Fatalf("LoadSale after close = %+v, %v; want closed", loaded, err)
		}
	})
}

// TestCloseCold: closing a sale Redis does not know (never warmed, or lost in a
// Redis restart) must not leave a partial meta behind: that would answer
// "warm already" to the re-warm from MySQL forever after.
func TestCloseCold(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		id := testenv.ID("cold")
		k := lua.KeysFor(id, nil)
		base := time.Now().Truncate(time.Millisecond)
		spec := &flashgate.Sale{ID: id, Title: "t", Total: 5, StartsAt: base.Add(-time.Minute),
			EndsAt: base.Add(time.Hour), PerUserLimit: 1, PerOrderMax: 1, Closed: true}
		s := &sale{t: t, c: c, spec: spec, k: k}
		t.Cleanup(s.drop)
		if err := lua.Close(ctx(t), c, k); err != nil {
			t.Fatal(err)
		}
		if _, err := lua.LoadSale(ctx(t), c, id); !errors.Is(err, lua.ErrNotWarmed) {
			t.Fatalf("LoadSale after closing a cold sale: %v, want ErrNotWarmed", err)
		}
		warmed, err := scripts.Warm(ctx(t), c, spec, map[string]int64{"": 5})
		if err != nil || !warmed {
			t.Fatalf("warm after close = %v, %v; want warmed", warmed, err)
		}
		if got := s.remaining(""); got != 5 {
			t.Fatalf("remaining = %d, want 5", got)
		}
		if res, _ := s.admit(lua.AdmitArgs{User: "u"}); res.Outcome != lua.Ended {
			t.Fatalf("admit on a sale warmed closed = %+v, want ended", res)
		}
	})
}

func TestBadQuantity(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, func(s *flashgate.Sale) { s.PerUserLimit, s.PerOrderMax = 5, 3 })
		for _, q := range []int64{-1, 4, 100, 1 << 50} {
			res, _ := s.admit(lua.AdmitArgs{User: "u", Quantity: q})
			if res.Outcome != lua.BadQuantity {
				t.Errorf("quantity %d: %+v, want bad quantity", q, res)
			}
		}
		// Quantity 0 explicitly (the helper turns 0 into 1).
		res, err := scripts.Admit(ctx(t), c, s.k, lua.AdmitArgs{User: "u", Quantity: 0, OrderID: nextID(), Now: time.Now()})
		if err != nil || res.Outcome != lua.BadQuantity {
			t.Errorf("quantity 0: %+v, %v", res, err)
		}
		if s.remaining("") != 10 || s.held("u") != 0 || len(s.resv()) != 0 {
			t.Fatal("a bad quantity moved something")
		}
		s.mustAdmit(lua.AdmitArgs{User: "u", Quantity: 3})
	})
}

func TestLimitReached(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, func(s *flashgate.Sale) { s.PerUserLimit, s.PerOrderMax = 3, 2 })
		steps := []struct {
			user string
			qty  int64
			want lua.Outcome
		}{
			{"alice", 2, lua.Admitted},
			{"alice", 2, lua.LimitReached}, // 2 + 2 > 3
			{"bob", 2, lua.Admitted},       // limits are per user
			{"alice", 1, lua.Admitted},     // 3
			{"alice", 1, lua.LimitReached},
			{"bob", 1, lua.Admitted},
			{"bob", 1, lua.LimitReached},
		}
		for i, st := range steps {
			res, _ := s.admit(lua.AdmitArgs{User: st.user, Quantity: st.qty})
			if res.Outcome != st.want {
				t.Fatalf("step %d %+v: %v, want %v", i, st, res.Outcome, st.want)
			}
		}
		if s.held("alice") != 3 || s.held("bob") != 3 || s.remaining("") != 4 || len(s.resv()) != 4 {
			t.Fatalf("alice %d, bob %d, remaining %d, %d reservations", s.held("alice"), s.held("bob"), s.remaining(""), len(s.resv()))
		}
	})
}

func TestSoldOut(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, func(s *flashgate.Sale) { s.Total, s.PerUserLimit, s.PerOrderMax = 3, 3, 2 })
		steps := []struct {
			user string
			qty  int64
			want lua.Outcome
			left int64
		}{
			{"a", 2, lua.Admitted, 1},
			{"b", 2, lua.SoldOut, 1}, // only 1 left: nothing partial
			{"b", 1, lua.Admitted, 0},
			{"c", 1, lua.SoldOut, 0},
			{"c", 2, lua.SoldOut, 0},
		}
		for i, st := range steps {
			res, _ := s.admit(lua.AdmitArgs{User: st.user, Quantity: st.qty})
			if res.Outcome != st.want || res.Remaining != st.left {
				t.Fatalf("step %d %+v: %+v", i, st, res)
			}
		}
		if got := s.remaining(""); got != 0 {
			t.Fatalf("stock = %d, want 0", got)
		}
		if s.held("c") != 0 || s.held("b") != 1 {
			t.Fatal("a sold-out refusal counted the user")
		}
	})
}

func TestRegions(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, func(s *flashgate.Sale) {
			s.Total, s.PerUserLimit, s.PerOrderMax = 3, 2, 1
			s.Regions = map[string]int64{"bj": 2, "sh": 1}
		})
		id, a := s.mustAdmit(lua.AdmitArgs{User: "u1", Region: "sh"})
		if rec, _ := s.order(id); rec.Region != "sh" || rec != record("pending", a) {
			t.Fatalf("order record %+v", rec)
		}
		res, _ := s.admit(lua.AdmitArgs{User: "u2", Region: "sh"})
		if res.Outcome != lua.SoldOut {
			t.Fatalf("sh after its last unit: %+v, want sold out", res)
		}
		// bj still sells: regions are independent.
		res, _ = s.admit(lua.AdmitArgs{User: "u2", Region: "bj"})
		if res.Outcome != lua.Admitted || res.Remaining != 1 {
			t.Fatalf("bj: %+v", res)
		}
		// The user's limit counts all regions.
		s.mustAdmit(lua.AdmitArgs{User: "u1", Region: "bj"})
		if res, _ := s.admit(lua.AdmitArgs{User: "u1", Region: "bj"}); res.Outcome != lua.LimitReached {
			t.Fatalf("third unit of u1: %+v, want limit reached", res)
		}
		if s.remaining("bj") != 0 || s.remaining("sh") != 0 {
			t.Fatal("stock not 0 in both regions")
		}
		for _, region := range []string{"gz", "", "BJ"} {
			if _, _, err := s.admitErr(lua.AdmitArgs{User: "u3", Region: region}); !errors.Is(err, lua.ErrUnknownRegion) {
				t.Errorf("region %q: %v, want ErrUnknownRegion", region, err)
			}
		}
		plain := newSale(t, c, nil)
		if _, _, err := plain.admitErr(lua.AdmitArgs{User: "u", Region: "bj"}); !errors.Is(err, lua.ErrUnknownRegion) {
			t.Errorf("region on a sale without regions: %v", err)
		}
	})
}

func TestReleaseGateway(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, func(s *flashgate.Sale) { s.PerUserLimit = 3 })
		id, a := s.mustAdmit(lua.AdmitArgs{User: "u", Quantity: 2, IdemKey: "k"})
		other, _ := s.mustAdmit(lua.AdmitArgs{User: "u", Quantity: 1})
		r := s.release(id, "", lua.ReleaseGateway, flashgate.ReasonPublishFailed)
		if !r.Released || r.Remaining != 9 {
			t.Fatalf("release = %+v, want released with 9 left", r)
		}
		if s.remaining("") != 9 || s.held("u") != 1 {
			t.Fatalf("remaining %d, u holds %d", s.remaining(""), s.held("u"))
		}
		resv := s.resv()
		if _, ok := resv[id]; ok || len(resv) != 1 {
			t.Fatalf("reservations after release: %+v", resv)
		}
		want := record("released", a)
		want.Reason = flashgate.ReasonPublishFailed
		if rec, ok := s.order(id); !ok || rec != want {
			t.Fatalf("tombstone = %+v, want %+v", rec, want)
		}
		// Twice: nothing more goes back.
		r = s.release(id, "", lua.ReleaseGateway, flashgate.ReasonPublishFailed)
		if r.Released || r.Status != "released" || s.remaining("") != 9 {
			t.Fatalf("second release = %+v, remaining %d", r, s.remaining(""))
		}
		// The idempotency key is free again: a retry is a new admission.
		again, _ := s.mustAdmit(lua.AdmitArgs{User: "u", Quantity: 2, IdemKey: "k"})
		if again == id {
			t.Fatal("retry answered the released order")
		}
		// The user's counter went to zero and away when everything is released.
		s.release(again, "", lua.ReleaseGateway, "")
		s.release(other, "", lua.ReleaseGateway, "")
		if n, err := c.Do(ctx(t), c.B().Hexists().Key(s.k.Users).Field("u").Build()).AsBool(); err != nil || n {
			t.Fatalf("users hash still has u (%v)", err)
		}
		if s.remaining("") != 10 || len(s.resv()) != 0 {
			t.Fatalf("remaining %d, %d reservations", s.remaining(""), len(s.resv()))
		}
	})
}

func TestReleaseBackend(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, nil)
		id, a := s.mustAdmit(lua.AdmitArgs{User: "u", Quantity: 2, IdemKey: "k"})
		if got := s.claim(id); got[0] != lua.ClaimOK {
			t.Fatalf("claim = %v", got)
		}
		r := s.release(id, "", lua.ReleaseBackend, flashgate.ReasonSoldOut)
		if !r.Released || r.Remaining != 10 || s.held("u") != 0 || len(s.resv()) != 0 {
			t.Fatalf("release = %+v", r)
		}
		want := record("failed", a)
		want.Reason = flashgate.ReasonSoldOut
		if rec, _ := s.order(id); rec != want {
			t.Fatalf("order = %+v, want %+v", rec, want)
		}
		// The key is kept: a replay shows the failed order.
		if res, _ := s.admit(lua.AdmitArgs{User: "u", IdemKey: "k"}); res.Outcome != lua.Replayed || res.OrderID != id {
			t.Fatalf("replay after a backend release = %+v", res)
		}
		r = s.release(id, "", lua.ReleaseBackend, flashgate.ReasonSoldOut)
		if r.Released || r.Status != "failed" || s.remaining("") != 10 {
			t.Fatalf("second release = %+v", r)
		}
		if r := s.release(id, "", lua.ReleaseGateway, ""); r.Released || r.Status != "failed" {
			t.Fatalf("gateway release of a failed order = %+v", r)
		}
	})
}

func TestReleaseAfterClaim(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, nil)
		id, a := s.mustAdmit(lua.AdmitArgs{User: "u", Quantity: 2, IdemKey: "k"})
		s.claim(id)
		r := s.release(id, "", lua.ReleaseGateway, flashgate.ReasonPublishFailed)
		if !r.Claimed || r.Released {
			t.Fatalf("release = %+v, want claimed", r)
		}
		if s.remaining("") != 8 || s.held("u") != 2 || len(s.resv()) != 1 {
			t.Fatal("a release of a claimed order freed something")
		}
		if rec, _ := s.order(id); rec != record("processing", a) {
			t.Fatalf("order = %+v", rec)
		}
		if res, _ := s.admit(lua.AdmitArgs{User: "u", IdemKey: "k"}); res.Outcome != lua.Replayed {
			t.Fatalf("the idempotency key was freed: %+v", res)
		}
	})
}

func TestReleaseOddCases(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, func(s *flashgate.Sale) {
			s.Total, s.PerOrderMax = 4, 1
			s.Regions = map[string]int64{"bj": 2, "sh": 2}
		})
		if r := s.release(nextID(), "bj", lua.ReleaseGateway, ""); !r.Unknown {
			t.Fatalf("release of an unknown id = %+v", r)
		}
		id, _ := s.mustAdmit(lua.AdmitArgs{User: "u", Region: "bj"})
		if _, err := scripts.Release(ctx(t), c, s.k, id, "sh", "", lua.ReleaseGateway, ""); err == nil || !strings.Contains(err.Error(), "region") {
			t.Fatalf("release into the wrong region: %v", err)
		}
		if _, err := scripts.Release(ctx(t), c, s.k, id, "gz", "", lua.ReleaseGateway, ""); !errors.Is(err, lua.ErrUnknownRegion) {
			t.Fatalf("release into an unknown region: %v", err)
		}
		if s.remaining("bj") != 1 || s.remaining("sh") != 2 || len(s.resv()) != 1 {
			t.Fatal("a refused release moved stock")
		}
		if r := s.release(id, "bj", lua.ReleaseGateway, ""); !r.Released || r.Remaining != 2 {
			t.Fatalf("release = %+v", r)
		}
	})
}

func TestClaim(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, nil)
		a1, args1 := s.mustAdmit(lua.AdmitArgs{User: "u1"})
		a2, _ := s.mustAdmit(lua.AdmitArgs{User: "u2"})
		s.release(a2, "", lua.ReleaseGateway, flashgate.ReasonPublishFailed)
		missing := nextID()
		want := []lua.ClaimStatus{lua.ClaimOK, lua.ClaimReleased, lua.ClaimUnknown}
		for i := 0; i < 2; i++ { // idempotent
			got := s.claim(a1, a2, missing)
			if !slices.Equal(got, want) {
				t.Fatalf("claim #%d = %v, want %v", i, got, want)
			}
			if rec, _ := s.order(a1); rec != record("processing", args1) {
				t.Fatalf("claimed order = %+v", rec)
			}
		}
		if _, ok := s.order(missing); ok {
			t.Fatal("claim created a record")
		}
		if got := s.claim(); len(got) != 0 {
			t.Fatalf("claim of nothing = %v", got)
		}
		// A settled order stays as it is.
		rec := record("", args1)
		if _, err := scripts.Confirm(ctx(t), c, s.k, []flashgate.Order{settled(a1, flashgate.OrderConfirmed, rec)}); err != nil {
			t.Fatal(err)
		}
		if got := s.claim(a1); got[0] != lua.ClaimOK {
			t.Fatalf("claim of a confirmed order = %v", got)
		}
		if got, _ := s.order(a1); got.Status != "confirmed" {
			t.Fatalf("claim changed a confirmed order to %q", got.Status)
		}
	})
}

func TestConfirm(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, nil)
		var ids []uint64
		var recs []flashgate.Order
		for _, u := range []string{"u1", "u2", "u3"} {
			id, a := s.mustAdmit(lua.AdmitArgs{User: u, Quantity: 2, IdemKey: "k" + u})
			ids, recs = append(ids, id), append(recs, record("", a))
		}
		s.claim(ids[0])
		done := []flashgate.Order{
			settled(ids[0], flashgate.OrderConfirmed, recs[0]),
			settled(ids[1], flashgate.OrderPaid, recs[1]),
		}
		n, err := scripts.Confirm(ctx(t), c, s.k, done)
		if err != nil || n != 2 {
			t.Fatalf("confirm = %d, %v; want 2", n, err)
		}
		for i, st := range []string{"confirmed", "paid"} {
			want := recs[i]
			want.Status = flashgate.OrderStatus(st)
			if got, _ := s.order(ids[i]); got != want {
				t.Errorf("order %d = %+v, want %+v", i, got, want)
			}
		}
		resv := s.resv()
		if _, ok := resv[ids[2]]; !ok || len(resv) != 1 {
			t.Fatalf("reservations = %+v, want only the third", resv)
		}
		if s.remaining("") != 4 {
			t.Fatal("confirm moved stock")
		}
		// Again: nothing more ends.
		if n, err := scripts.Confirm(ctx(t), c, s.k, done); err != nil || n != 0 {
			t.Fatalf("second confirm = %d, %v", n, err)
		}
		// An order Redis lost is written back from the record, reason included.
		lost := flashgate.Order{UserID: "u9", Quantity: 1, Region: "", CreatedAt: ms(1000), ExpiresAt: ms(2000), IdemKey: "x", Reason: flashgate.ReasonLimitReached}
		id := nextID()
		if n, err := scripts.Confirm(ctx(t), c, s.k, []flashgate.Order{settled(id, flashgate.OrderFailed, lost)}); err != nil || n != 0 {
			t.Fatalf("confirm of a lost order = %d, %v", n, err)
		}
		want := lost
		want.Status = "failed"
		if got, ok := s.order(id); !ok || got != want {
			t.Fatalf("rewritten order = %+v, %v; want %+v", got, ok, want)
		}
		if n, err := scripts.Confirm(ctx(t), c, s.k, nil); err != nil || n != 0 {
			t.Fatalf("confirm of nothing = %d, %v", n, err)
		}
	})
}

func TestWarm(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, nil)
		s.mustAdmit(lua.AdmitArgs{User: "u", Quantity: 2})
		warmed, err := scripts.Warm(ctx(t), c, s.spec, map[string]int64{"": s.spec.Total})
		if err != nil || warmed {
			t.Fatalf("second warm = %v, %v; want false", warmed, err)
		}
		if got := s.remaining(""); got != 8 {
			t.Fatalf("second warm reset stock to %d", got)
		}
		in, err := c.Do(ctx(t), c.B().Sismember().Key(lua.SalesIndex).Member(s.spec.ID).Build()).AsBool()
		if err != nil || !in {
			t.Fatalf("sale not in %s (%v)", lua.SalesIndex, err)
		}
	})
}

func TestLoadSale(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		for _, tc := range []struct {
			name string
			edit func(*flashgate.Sale)
		}{
			{"plain", nil},
			{"regions", func(s *flashgate.Sale) {
				s.Title, s.Total, s.PriceCents = "Mate 70 — 北京 | 上海", 1000, 0
				s.Regions = map[string]int64{"bj": 400, "sh-1": 600, "gz_2": 0}
				s.PerUserLimit, s.PerOrderMax = 5, 3
			}},
			{"closed", func(s *flashgate.Sale) { s.Closed = true }},
		} {
			t.Run(tc.name, func(t *testing.T) {
				s := newSale(t, c, tc.edit)
				got, err := lua.LoadSale(ctx(t), c, s.spec.ID)
				if err != nil {
					t.Fatal(err)
				}
				want := *s.spec
				want.StartsAt, want.EndsAt = want.StartsAt.UTC(), want.EndsAt.UTC()
				if fmt.Sprint(*got) != fmt.Sprint(want) || !got.StartsAt.Equal(want.StartsAt) || !got.EndsAt.Equal(want.EndsAt) {
					t.Fatalf("LoadSale = %+v\nwant       %+v", *got, want)
				}
			})
		}
		if _, err := lua.LoadSale(ctx(t), c, testenv.ID("none")); !errors.Is(err, lua.ErrNotWarmed) {
			t.Fatalf("LoadSale of an unknown sale: %v", err)
		}
	})
}

func TestRemainingRegions(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, func(s *flashgate.Sale) {
			s.Total = 10
			s.Regions = map[string]int64{"bj": 7, "sh": 3}
		})
		m, err := lua.Remaining(ctx(t), c, s.k)
		if err != nil || len(m) != 2 || m["bj"] != 7 || m["sh"] != 3 {
			t.Fatalf("Remaining = %v, %v", m, err)
		}
		bj, _ := s.k.Stock("bj")
		if err := c.Do(ctx(t), c.B().Del().Key(bj).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		m, err = lua.Remaining(ctx(t), c, s.k)
		if _, ok := m["bj"]; err != nil || ok || m["sh"] != 3 {
			t.Fatalf("Remaining with a lost key = %v, %v; want bj absent", m, err)
		}
	})
}

// TestConcurrentAdmits: a flood of buyers against few units admits exactly the
// stock, never more (invariants 1 and 2 at the Redis layer).
func TestConcurrentAdmits(t *testing.T) {
	const buyers, units = 1000, 100
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		for _, tc := range []struct {
			name      string
			limit     int64
			user      func(i int) string
			admitted  int
			refusal   lua.Outcome
			remaining int64
		}{
			{"distinct users", 1, func(i int) string { return "u" + strconv.Itoa(i) }, units, lua.SoldOut, 0},
			{"one user", 3, func(int) string { return "greedy" }, 3, lua.LimitReached, units - 3},
		} {
			t.Run(tc.name, func(t *testing.T) {
				s := newSale(t, c, func(s *flashgate.Sale) { s.Total, s.PerUserLimit, s.PerOrderMax = units, tc.limit, 1 })
				var wg sync.WaitGroup
				results := make([]lua.Admission, buyers)
				errs := make([]error, buyers)
				start := make(chan struct{})
				for i := range buyers {
					wg.Go(func() {
						<-start
						results[i], _, errs[i] = s.admitErr(lua.AdmitArgs{User: tc.user(i)})
					})
				}
				close(start)
				wg.Wait()
				count := map[lua.Outcome]int{}
				ids := map[uint64]bool{}
				for i, r := range results {
					if errs[i] != nil {
						t.Fatalf("admit %d: %v", i, errs[i])
					}
					count[r.Outcome]++
					if r.Outcome == lua.Admitted {
						ids[r.OrderID] = true
					}
				}
				if count[lua.Admitted] != tc.admitted || count[tc.refusal] != buyers-tc.admitted || len(ids) != tc.admitted {
					t.Fatalf("outcomes %v, %d distinct ids; want %d admitted, %d %v", count, len(ids), tc.admitted, buyers-tc.admitted, tc.refusal)
				}
				if got := s.remaining(""); got != tc.remaining {
					t.Fatalf("stock %d, want %d", got, tc.remaining)
				}
				resv := s.resv()
				if len(resv) != tc.admitted {
					t.Fatalf("%d reservations, want %d", len(resv), tc.admitted)
				}
				for id := range ids {
					if _, ok := resv[id]; !ok {
						t.Fatalf("admitted order %d has no reservation", id)
					}
				}
			})
		}
	})
}

// TestInvariant drives a random mix of admits, replays, claims, releases and
// confirms and checks after every step, per stock key, that
// remaining + reserved + sold == total, and, per user, that the users hash
// equals the units the user holds (docs/design.md §2, 1-3 at the Redis layer).
func TestInvariant(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		for _, regions := range []map[string]int64{nil, {"bj": 13, "sh": 7, "gz": 0}} {
			t.Run(fmt.Sprintf("regions=%d", len(regions)), func(t *testing.T) {
				seed := uint64(time.Now().UnixNano())
				t.Logf("seed %d", seed)
				rng := rand.New(rand.NewPCG(seed, 1))
				s := newSale(t, c, func(s *flashgate.Sale) {
					s.Total, s.PerUserLimit, s.PerOrderMax, s.Regions = 20, 4, 3, regions
				})
				stockRegions := []string{""}
				if regions != nil {
					stockRegions = s.spec.RegionNames()
				}
				total := map[string]int64{"": s.spec.Total}
				if regions != nil {
					total = regions
				}
				type live struct {
					user, region string
					qty          int64
					idem         string
				}
				pending := map[uint64]live{} // reserved in Redis
				sold := map[string]int64{}   // confirmed: counted by MySQL
				holds := map[string]int64{}  // per user: reserved + confirmed
				idems := map[string]uint64{} // user|key -> order
				users := []string{"a", "b", "c", "d", "e"}
				pick := func() (uint64, live, bool) {
					if len(pending) == 0 {
						return 0, live{}, false
					}
					n := rng.IntN(len(pending))
					for id, l := range pending {
						if n == 0 {
							return id, l, true
						}
						n--
					}
					panic("unreachable")
				}
				for step := 0; step < 300; step++ {
					switch op := rng.IntN(10); {
					case op < 6: // admit, sometimes with a key that may replay
						a := lua.AdmitArgs{User: users[rng.IntN(len(users))], Quantity: 1 + rng.Int64N(3),
							Region: stockRegions[rng.IntN(len(stockRegions))]}
						if rng.IntN(2) == 0 {
							a.IdemKey = "k" + strconv.Itoa(rng.IntN(4))
						}
						res, a := s.admit(a)
						switch res.Outcome {
						case lua.Admitted:
							pending[res.OrderID] = live{a.User, a.Region, a.Quantity, a.IdemKey}
							holds[a.User] += a.Quantity
							if a.IdemKey != "" {
								idems[a.User+"|"+a.IdemKey] = res.OrderID
							}
						case lua.Replayed:
							if want, ok := idems[a.User+"|"+a.IdemKey]; !ok || want != res.OrderID {
								t.Fatalf("step %d: replay of %+v answered %d, want %d (%v)", step, a, res.OrderID, want, ok)
							}
						case lua.SoldOut, lua.LimitReached:
						default:
							t.Fatalf("step %d: admit %+v = %+v", step, a, res)
						}
					case op < 8: // release, as gateway or backend
						id, l, ok := pick()
						if !ok {
							continue
						}
						if rng.IntN(2) == 0 {
							s.claim(id)
						}
						mode := lua.ReleaseBackend
						if rng.IntN(2) == 0 {
							mode = lua.ReleaseGateway
						}
						r := s.release(id, l.region, mode, "test")
						if r.Claimed {
							continue // the backend owns it now
						}
						if !r.Released {
							t.Fatalf("step %d: release %d = %+v", step, id, r)
						}
						delete(pending, id)
						holds[l.user] -= l.qty
						if mode == lua.ReleaseGateway && l.idem != "" {
							delete(idems, l.user+"|"+l.idem)
						}
					default: // confirm
						id, l, ok := pick()
						if !ok {
							continue
						}
						s.claim(id)
						n, err := scripts.Confirm(ctx(t), c, s.k, []flashgate.Order{settled(id, flashgate.OrderConfirmed,
							flashgate.Order{UserID: l.user, Quantity: l.qty, Region: l.region, IdemKey: l.idem})})
						if err != nil || n != 1 {
							t.Fatalf("step %d: confirm %d = %d, %v", step, id, n, err)
						}
						delete(pending, id)
						sold[l.region] += l.qty
					}
					// Redis side, per stock key.
					resv := s.resv()
					reserved := map[string]int64{}
					for _, r := range resv {
						reserved[r.Region] += r.Quantity
					}
					if len(resv) != len(pending) {
						t.Fatalf("step %d: %d reservations in Redis, %d in the test", step, len(resv), len(pending))
					}
					for _, r := range stockRegions {
						if rem := s.remaining(r); rem < 0 || rem+reserved[r]+sold[r] != total[r] {
							t.Fatalf("step %d region %q: remaining %d + reserved %d + sold %d != total %d",
								step, r, rem, reserved[r], sold[r], total[r])
						}
					}
					for _, u := range users {
						if got := s.held(u); got != holds[u] || got > s.spec.PerUserLimit {
							t.Fatalf("step %d: %s holds %d in Redis, %d in the test (limit %d)", step, u, got, holds[u], s.spec.PerUserLimit)
						}
					}
				}
			})
		}
	})
}

func BenchmarkAdmit(b *testing.B) {
	c := testenv.Redis(b, testenv.RedisAddrs())
	s := newSale(b, c, func(s *flashgate.Sale) {
		s.Total, s.PerUserLimit, s.PerOrderMax = flashgate.MaxSaleUnits, 1, 1
	})
	var user atomic.Int64
	// Many callers per CPU, as a gateway has: rueidis pipelines their calls.
	b.SetParallelism(32)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			a := lua.AdmitArgs{User: "u" + strconv.FormatInt(user.Add(1), 10), Quantity: 1,
				OrderID: nextID(), Now: time.Now()}
			a.PayBy = a.Now.Add(15 * time.Minute)
			res, err := scripts.Admit(ctx, c, s.k, a)
			if err != nil || res.Outcome != lua.Admitted {
				b.Fatalf("admit = %+v, %v", res, err)
			}
		}
	})
}
