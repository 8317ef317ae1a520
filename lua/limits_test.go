package lua_test

import (
	"context"
	"fmt"
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

// Purchase limits across dimensions (seed 001), decided in the admission script
// together with the stock.

// limited warms a sale of total units with the given limits (per_user_limit
// and per_order_max as large as the test needs) in zone tz.
func limited(t *testing.T, c rueidis.Client, total int64, tz string, limits ...flashgate.Limit) *sale {
	t.Helper()
	s := newSale(t, c, func(s *flashgate.Sale) {
		s.Total, s.PerUserLimit, s.PerOrderMax = total, total, min(total, 4)
		s.Limits, s.TimeZone = limits, tz
	})
	t.Cleanup(func() { s.dropLimits() })
	return s
}

// dropLimits deletes the whole-sale counters; window counters expire by
// themselves.
func (s *sale) dropLimits() {
	_ = s.c.Do(ctx(s.t), s.c.B().Del().Key(s.k.Limit("sale")).Build()).Error()
}

// buy admits one purchase by sub of qty at now with the sale's charges.
func (s *sale) buy(sub flashgate.Subjects, qty int64, now time.Time) lua.Admission {
	s.t.Helper()
	loc, err := s.spec.Location()
	if err != nil {
		s.t.Fatal(err)
	}
	cs, err := s.spec.Charges(sub, qty, now, loc)
	if err != nil {
		s.t.Fatalf("charges: %v", err)
	}
	res, _ := s.admit(lua.AdmitArgs{User: sub.User, Quantity: qty, Now: now, Charges: cs, Limits: s.spec.Limits})
	return res
}

// counter reads one window counter field.
func (s *sale) counter(window string, limit int, subject string) int64 {
	s.t.Helper()
	v, err := s.c.Do(ctx(s.t), s.c.B().Hget().Key(s.k.Limit(window)).Field(strconv.Itoa(limit)+"/"+subject).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0
	}
	if err != nil {
		s.t.Fatal(err)
	}
	return v
}

func TestLimitEachDimension(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		dims := []flashgate.Dimension{flashgate.DimUser, flashgate.DimPhone, flashgate.DimDevice, flashgate.DimIP, flashgate.DimAddress}
		for _, d := range dims {
			t.Run(string(d), func(t *testing.T) {
				s := limited(t, c, 100, "", flashgate.Limit{Dimension: d, Max: 3})
				// Five buyers who share the one subject of dimension d and
				// differ in every other.
				buyer := func(i int) flashgate.Subjects {
					sub := flashgate.Subjects{User: fmt.Sprintf("u%d", i), Phone: fmt.Sprintf("+86138000%05d", i),
						Device: fmt.Sprintf("dev-%d", i), IP: fmt.Sprintf("198.18.0.%d", i+1), Address: fmt.Sprintf("addr%d", i)}
					switch d {
					case flashgate.DimUser:
						sub.User = "shared"
					case flashgate.DimPhone:
						sub.Phone = "+8613800000000"
					case flashgate.DimDevice:
						sub.Device = "shared-device"
					case flashgate.DimIP:
						sub.IP = "198.18.9.9"
					case flashgate.DimAddress:
						sub.Address = "sharedaddress"
					}
					return sub
				}
				now := time.Now()
				if r := s.buy(buyer(0), 2, now); r.Outcome != lua.Admitted {
					t.Fatalf("first: %+v", r)
				}
				r := s.buy(buyer(1), 2, now) // 2 + 2 > 3
				if r.Outcome != lua.LimitReached || r.Limit != 0 || r.Held != 2 {
					t.Fatalf("over the limit: %+v", r)
				}
				if r := s.buy(buyer(2), 1, now); r.Outcome != lua.Admitted {
					t.Fatalf("up to the limit: %+v", r)
				}
				if r := s.buy(buyer(3), 1, now); r.Outcome != lua.LimitReached {
					t.Fatalf("past the limit: %+v", r)
				}
				if got := s.remaining(""); got != 97 {
					t.Fatalf("remaining %d, want 97: a refusal reserved something", got)
				}
				shared := buyer(0)
				if got := s.counter("sale", 0, (&shared).Of(d)); got != 3 {
					t.Fatalf("counter %d, want 3", got)
				}
			})
		}
	})
}

func TestLimitOrdersNotUnits(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := limited(t, c, 100, "", flashgate.Limit{Dimension: flashgate.DimPhone, Max: 2, Of: flashgate.OfOrders})
		sub := func(u string) flashgate.Subjects { return flashgate.Subjects{User: u, Phone: "+8613800000001"} }
		now := time.Now()
		for i, u := range []string{"a", "b"} {
			if r := s.buy(sub(u), 4, now); r.Outcome != lua.Admitted {
				t.Fatalf("order %d of 4 units: %+v", i, r)
			}
		}
		if r := s.buy(sub("c"), 1, now); r.Outcome != lua.LimitReached || r.Held != 2 {
			t.Fatalf("third order: %+v", r)
		}
		if got := s.counter("sale", 0, "+8613800000001"); got != 2 {
			t.Fatalf("orders counted %d, want 2", got)
		}
	})
}

// TestLimitsCombined: five limits at once; the one that refuses is named, and
// a refusal by any of them moves no counter.
func TestLimitsCombined(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := limited(t, c, 1000, "Asia/Shanghai",
			flashgate.Limit{Dimension: flashgate.DimUser, Max: 4, Per: flashgate.PerMonth},
			flashgate.Limit{Dimension: flashgate.DimPhone, Max: 1, Of: flashgate.OfOrders, Per: flashgate.PerDay},
			flashgate.Limit{Dimension: flashgate.DimDevice, Max: 3},
			flashgate.Limit{Dimension: flashgate.DimIP, Max: 5, Per: flashgate.PerDay},
			flashgate.Limit{Dimension: flashgate.DimAddress, Max: 2},
		)
		now := time.Now()
		day, _ := flashgate.Window(flashgate.PerDay, now, mustLoc(t, "Asia/Shanghai"))
		month, _ := flashgate.Window(flashgate.PerMonth, now, mustLoc(t, "Asia/Shanghai"))
		a := flashgate.Subjects{User: "ua", Phone: "+8613800000001", Device: "dev-a", IP: "198.18.0.1", Address: "home"}
		if r := s.buy(a, 2, now); r.Outcome != lua.Admitted {
			t.Fatalf("first: %+v", r)
		}
		type want struct {
			limit int
			sub   flashgate.Subjects
			qty   int64
		}
		for _, w := range []want{
			{1, flashgate.Subjects{User: "ub", Phone: a.Phone, Device: "dev-b", IP: "198.18.0.2", Address: "b"}, 1},             // same phone today
			{4, flashgate.Subjects{User: "uc", Phone: "+8613800000003", Device: "dev-c", IP: "198.18.0.3", Address: "home"}, 1}, // address 2+1
			{2, flashgate.Subjects{User: "ud", Phone: "+8613800000004", Device: "dev-a", IP: "198.18.0.4", Address: "d"}, 2},    // device 2+2
		} {
			before := s.remaining("")
			r := s.buy(w.sub, w.qty, now)
			if r.Outcome != lua.LimitReached || r.Limit != w.limit {
				t.Fatalf("%+v: %+v, want limit %d (%s)", w.sub, r, w.limit, s.spec.Limits[w.limit].Dimension)
			}
			if s.remaining("") != before || s.counter("sale", 2, w.sub.Device) > 2 || s.counter(month, 0, w.sub.User) != 0 {
				t.Fatalf("a refusal moved counters")
			}
		}
		if got := []int64{s.counter(month, 0, "ua"), s.counter(day, 1, a.Phone), s.counter("sale", 2, "dev-a"),
			s.counter(day, 3, "198.18.0.1"), s.counter("sale", 4, "home")}; fmt.Sprint(got) != "[2 1 2 2 2]" {
			t.Fatalf("counters %v", got)
		}
		// Windowed counters expire by themselves, a little after their window.
		for _, w := range []string{day, month} {
			ttl, err := c.Do(ctx(t), c.B().Pttl().Key(s.k.Limit(w)).Build()).AsInt64()
			end := flashgate.WindowEnd(w, mustLoc(t, "Asia/Shanghai"))
			max := end.Sub(now) + time.Hour // set at the admission, at now
			if err != nil || ttl <= 0 || time.Duration(ttl)*time.Millisecond > max || time.Duration(ttl)*time.Millisecond < max-time.Minute {
				t.Fatalf("TTL of %s: %d ms, %v; want about %v", w, ttl, err, max)
			}
		}
		if ttl, _ := c.Do(ctx(t), c.B().Pttl().Key(s.k.Limit("sale")).Build()).AsInt64(); ttl != -1 {
			t.Fatalf("the whole-sale counters must not expire: PTTL %d", ttl)
		}
	})
}

func mustLoc(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// TestLimitWindowBoundary drives the clock through the script's now: a phone's
// one order a day is refused until midnight in the sale's zone, and allowed
// again one second after it.
func TestLimitWindowBoundary(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := limited(t, c, 100, "Asia/Shanghai",
			flashgate.Limit{Dimension: flashgate.DimPhone, Max: 1, Of: flashgate.OfOrders, Per: flashgate.PerDay},
			flashgate.Limit{Dimension: flashgate.DimPhone, Max: 2, Of: flashgate.OfOrders, Per: flashgate.PerMonth})
		loc := mustLoc(t, "Asia/Shanghai")
		// The next month boundary after tomorrow, in Shanghai; the sale runs across it.
		y, m, _ := time.Now().In(loc).Date()
		midnight := time.Date(y, m+1, 1, 0, 0, 0, 0, loc)
		s.spec.EndsAt = midnight.AddDate(0, 1, 5)
		// Warm it again with the longer window.
		_ = c.Do(ctx(t), c.B().Del().Key(s.k.Meta).Build()).Error()
		if _, err := scripts.Warm(ctx(t), c, s.spec, map[string]int64{"": 100}); err != nil {
			t.Fatal(err)
		}
		sub := func(u string) flashgate.Subjects { return flashgate.Subjects{User: u, Phone: "+8613900000000"} }

		at := []struct {
			now   time.Time
			user  string
			want  lua.Outcome
			limit int
		}{
			{midnight.Add(-2 * time.Hour), "a", lua.Admitted, 0},
			{midnight.Add(-time.Second), "b", lua.LimitReached, 0}, // the same day
			{midnight.Add(time.Second), "c", lua.Admitted, 0},      // a new day and a new month
			{midnight.Add(time.Hour), "d", lua.LimitReached, 0},
			{midnight.Add(24 * time.Hour), "e", lua.Admitted, 0},
			{midnight.Add(48 * time.Hour), "f", lua.LimitReached, 1}, // 2 orders this month
		}
		for i, a := range at {
			r := s.buy(sub(a.user), 1, a.now)
			if r.Outcome != a.want || (a.want == lua.LimitReached && r.Limit != a.limit) {
				t.Fatalf("step %d at %v: %+v, want %v (limit %d)", i, a.now.In(loc), r, a.want, a.limit)
			}
		}
	})
}

// TestLimitUndo: a release (both modes) and a restock give back exactly what
// the admission counted, once.
func TestLimitUndo(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := limited(t, c, 100, "UTC",
			flashgate.Limit{Dimension: flashgate.DimPhone, Max: 3, Per: flashgate.PerDay},
			flashgate.Limit{Dimension: flashgate.DimAddress, Max: 2, Of: flashgate.OfOrders})
		now := time.Now()
		day, _ := flashgate.Window(flashgate.PerDay, now, time.UTC)
		sub := flashgate.Subjects{User: "u1", Phone: "+8613700000000", Address: "addr"}
		cs, _ := s.spec.Charges(sub, 2, now, time.UTC)
		enc := flashgate.EncodeCharges(cs)
		admit := func() uint64 {
			id, _ := s.mustAdmit(lua.AdmitArgs{User: "u1", Quantity: 2, Now: now, Charges: cs, Limits: s.spec.Limits})
			return id
		}
		check := func(phone, addr int64) {
			t.Helper()
			if p, a := s.counter(day, 0, sub.Phone), s.counter("sale", 1, "addr"); p != phone || a != addr {
				t.Fatalf("counters phone %d address %d, want %d %d", p, a, phone, addr)
			}
		}
		id := admit()
		check(2, 1)
		for range 2 {
			if _, err := scripts.Release(ctx(t), c, s.k, id, "", enc, lua.ReleaseGateway, "publish_failed"); err != nil {
				t.Fatal(err)
			}
			check(0, 0)
		}
		if n, _ := c.Do(ctx(t), c.B().Hlen().Key(s.k.Limit(day)).Build()).AsInt64(); n != 0 {
			t.Fatalf("%d fields left in the day's counters", n)
		}
		// The keys the caller names must cover the order's windows.
		id = admit()
		if _, err := scripts.Release(ctx(t), c, s.k, id, "", "", lua.ReleaseBackend, "sold_out"); err == nil {
			t.Fatal("release without the window keys went through")
		}
		if _, err := scripts.Release(ctx(t), c, s.k, id, "", enc, lua.ReleaseBackend, "sold_out"); err != nil {
			t.Fatal(err)
		}
		check(0, 0)

		id = admit()
		check(2, 1)
		s.claim(id)
		rec, _ := s.order(id)
		if rec.Charges != enc {
			t.Fatalf("record charges %q, want %q", rec.Charges, enc)
		}
		for range 2 {
			out, err := scripts.RestockMany(ctx(t), c, s.k, []flashgate.Order{restocking(id, flashgate.OrderCanceled,
				flashgate.ReasonCanceled, rec)})
			if err != nil {
				t.Fatal(err)
			}
			check(0, 0)
			_ = out
		}
		// A buyer's cancel: the charges and the units come back, the buyer's own quota does not.
		if s.remaining("") != 100 || s.held("u1") != 2 {
			t.Fatalf("remaining %d held %d, want 100 and 2", s.remaining(""), s.held("u1"))
		}
	})
}

// TestLimitQuantityAtTheEnd: 2 units left, two buyers each ask for 2 at once:
// exactly one gets them, stock ends 0, never negative.
func TestLimitQuantityAtTheEnd(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		for round := range 20 {
			s := newSale(t, c, func(s *flashgate.Sale) { s.Total, s.PerUserLimit, s.PerOrderMax = 2, 2, 2 })
			var wg sync.WaitGroup
			res := make([]lua.Admission, 2)
			for i := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res[i], _ = s.admit(lua.AdmitArgs{User: fmt.Sprintf("buyer%d", i), Quantity: 2})
				}()
			}
			wg.Wait()
			ok := 0
			for _, r := range res {
				if r.Outcome == lua.Admitted {
					ok++
				} else if r.Outcome != lua.SoldOut {
					t.Fatalf("round %d: %+v", round, r)
				}
			}
			if ok != 1 || s.remaining("") != 0 {
				t.Fatalf("round %d: %d admitted, %d left", round, ok, s.remaining(""))
			}
		}
	})
}

// TestLimitConcurrentSharedPhone: 40 buyers who share one phone race for a
// sale that lets a phone buy 3 units: exactly 3 are admitted.
func TestLimitConcurrentSharedPhone(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := limited(t, c, 100, "", flashgate.Limit{Dimension: flashgate.DimPhone, Max: 3})
		var wg sync.WaitGroup
		var mu sync.Mutex
		admitted := 0
		for i := range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := s.buy(flashgate.Subjects{User: fmt.Sprintf("u%d", i), Phone: "+8613600000000"}, 1, time.Now())
				mu.Lock()
				defer mu.Unlock()
				if r.Outcome == lua.Admitted {
					admitted++
				}
			}()
		}
		wg.Wait()
		if admitted != 3 || s.remaining("") != 97 || s.counter("sale", 0, "+8613600000000") != 3 {
			t.Fatalf("admitted %d, remaining %d", admitted, s.remaining(""))
		}
	})
}

// BenchmarkAdmitDimensions compares the admission with the per-user limit
// alone (1 dimension) against user, phone, device, IP and address limits at
// once (5), on the standalone Redis, each admission a new buyer. It reports
// Redis memory per admitted buyer (used_memory grown / admissions: the order's
// record, reservation, buyer counter and, with 5, four limit counters).
func BenchmarkAdmitDimensions(b *testing.B) {
	for _, dims := range []int{1, 5} {
		b.Run(fmt.Sprintf("dims=%d", dims), func(b *testing.B) {
			c := testenv.Redis(b, testenv.RedisAddrs())
			s := newSale(b, c, func(s *flashgate.Sale) {
				s.Total, s.PerUserLimit, s.PerOrderMax = flashgate.MaxSaleUnits, 1, 1
				s.TimeZone = "Asia/Shanghai"
				if dims == 5 {
					s.Limits = []flashgate.Limit{
						{Dimension: flashgate.DimPhone, Max: 1, Of: flashgate.OfOrders, Per: flashgate.PerDay},
						{Dimension: flashgate.DimDevice, Max: 2},
						{Dimension: flashgate.DimIP, Max: 3, Per: flashgate.PerMonth},
						{Dimension: flashgate.DimAddress, Max: 1, Of: flashgate.OfOrders},
					}
				}
			})
			b.Cleanup(func() {
				loc, _ := s.spec.Location()
				d, _ := flashgate.Window(flashgate.PerDay, time.Now(), loc)
				m, _ := flashgate.Window(flashgate.PerMonth, time.Now(), loc)
				_ = c.Do(context.Background(), c.B().Del().Key(s.k.Limit("sale"), s.k.Limit(d), s.k.Limit(m)).Build()).Error()
			})
			loc, _ := s.spec.Location()
			before := usedMemory(b, c)
			var n atomic.Int64
			b.SetParallelism(32)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					i := n.Add(1)
					now := time.Now()
					sub := flashgate.Subjects{User: "u" + strconv.FormatInt(i, 10), Phone: fmt.Sprintf("+86139%08d", i),
						Device: "dev-" + strconv.FormatInt(i, 10), IP: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255),
						Address: fmt.Sprintf("%032x", i)}
					cs, err := s.spec.Charges(sub, 1, now, loc)
					if err != nil {
						b.Fatal(err)
					}
					res, err := scripts.Admit(ctx, c, s.k, lua.AdmitArgs{User: sub.User, Quantity: 1, OrderID: nextID(), Now: now,
						PayBy: now.Add(15 * time.Minute), Charges: cs, Limits: s.spec.Limits})
					if err != nil || res.Outcome != lua.Admitted {
						b.Fatalf("admit = %+v, %v", res, err)
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(usedMemory(b, c)-before)/float64(b.N), "redis-B/buyer")
		})
	}
}

func usedMemory(b *testing.B, c rueidis.Client) int64 {
	b.Helper()
	info, err := c.Do(context.Background(), c.B().Info().Section("memory").Build()).ToString()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	b.Fatal("no used_memory in INFO")
	return 0
}
