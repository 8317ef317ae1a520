package metrics

import (
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/metrics/metricstest"
)

// TestBuildInfo: both processes export flashgate_build_info with the Go
// version that built them.
func TestBuildInfo(t *testing.T) {
	for _, fs := range []metricstest.Families{metricstest.Handler(t, NewGateway().Handler()), metricstest.Handler(t, NewBackend().Handler())} {
		if v := value(t, fs, "flashgate_build_info", "goversion", runtime.Version()); v != 1 {
			t.Fatalf("flashgate_build_info = %v, want 1", v)
		}
	}
}

// TestSalesGauges: Set shows a sale's books, Forget drops one sale, Reset all.
func TestSalesGauges(t *testing.T) {
	m := NewBackend()
	s := NewSales(m.Registry())
	s.Set("a", SaleState{Total: 10, Remaining: 3, Reserved: 2, Sold: 4, Pending: 2, Conservation: -1})
	s.Set("b", SaleState{Total: 5, Remaining: 5})
	fs := metricstest.Handler(t, m.Handler())
	for name, want := range map[string]float64{
		"flashgate_sale_total_units": 10, "flashgate_sale_remaining_units": 3, "flashgate_sale_reserved_units": 2,
		"flashgate_sale_sold_units": 4, "flashgate_sale_pending_orders": 2, "flashgate_sale_conservation_error_units": -1,
	} {
		if v := value(t, fs, name, "sale", "a"); v != want {
			t.Errorf("%s{sale=a} = %v, want %v", name, v, want)
		}
	}
	s.Forget("a")
	fs = metricstest.Handler(t, m.Handler())
	if _, ok := fs.Value("flashgate_sale_total_units", "sale", "a"); ok {
		t.Fatal("sale a still exported after Forget")
	}
	if v := value(t, fs, "flashgate_sale_total_units", "sale", "b"); v != 5 {
		t.Fatalf("sale b: %v", v)
	}
	s.Reset()
	if n := metricstest.Handler(t, m.Handler()).Series("flashgate_sale_total_units"); n != 0 {
		t.Fatalf("%d series after Reset", n)
	}
}

// TestSaleCounters: counts by code, unknown codes as other, and Add
// allocates nothing (it runs on every purchase, refusals included).
func TestSaleCounters(t *testing.T) {
	var c SaleCounters
	c.Add(flashgate.CodeAccepted)
	c.Add(flashgate.CodeSoldOut)
	c.Add(flashgate.CodeSoldOut)
	c.Add("no_such_code")
	got := c.Snapshot()
	if got["accepted"] != 1 || got["sold_out"] != 2 || got["other"] != 1 || len(got) != 3 {
		t.Fatalf("snapshot %v", got)
	}
	if a := testing.AllocsPerRun(1000, func() { c.Add(flashgate.CodeRateLimited) }); a != 0 {
		t.Fatalf("Add allocates %v per call", a)
	}
}

// TestAcceptedLatency: a 202's latency lands in the first bucket whose bound
// it does not pass (past the largest: the last entry), Accepted allocates
// nothing, and LatencyQuantile reads a quantile back as histogram_quantile
// would.
func TestAcceptedLatency(t *testing.T) {
	var c SaleCounters
	if c.AcceptedLatency() != nil {
		t.Fatal("latency counts before any 202")
	}
	bounds := LatencyBounds()
	c.Accepted(0)                     // bucket 0
	c.Accepted(50 * time.Microsecond) // on the bound: bucket 0
	c.Accepted(3 * time.Millisecond)  // (2.5ms, 5ms]
	c.Accepted(time.Minute)           // past 5s: the last
	got := c.AcceptedLatency()
	if len(got) != len(bounds)+1 {
		t.Fatalf("%d buckets, want %d", len(got), len(bounds)+1)
	}
	want := make([]uint64, len(bounds)+1)
	want[0], want[len(bounds)] = 2, 1
	for i, b := range bounds {
		if b == 5e-3 {
			want[i] = 1
		}
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("buckets %v, want %v", got, want)
		}
	}
	if a := testing.AllocsPerRun(1000, func() { c.Accepted(7 * time.Millisecond) }); a != 0 {
		t.Fatalf("Accepted allocates %v per call", a)
	}

	// 100 answers: 98 in (1ms, 2.5ms], 2 in (5ms, 10ms]: the 99th is halfway
	// through the latter bucket, the 50th a third through the former.
	counts := make([]uint64, len(bounds)+1)
	idx := func(b float64) int {
		for i, v := range bounds {
			if v == b {
				return i
			}
		}
		t.Fatalf("no bound %v", b)
		return 0
	}
	counts[idx(2.5e-3)], counts[idx(10e-3)] = 98, 2
	for q, want := range map[float64]float64{0.99: 7.5e-3, 0.5: 1e-3 + 1.5e-3*50/98} {
		if v, ok := LatencyQuantile(counts, q); !ok || math.Abs(v-want) > 1e-9 {
			t.Errorf("q%v = %v (%t), want %v", q, v, ok, want)
		}
	}
	counts[len(bounds)] = 1000 // most past the largest bound: that bound
	if v, _ := LatencyQuantile(counts, 0.99); v != bounds[len(bounds)-1] {
		t.Errorf("q0.99 past the largest bound = %v", v)
	}
	if _, ok := LatencyQuantile(make([]uint64, len(bounds)+1), 0.99); ok {
		t.Error("a quantile of nothing")
	}
	if _, ok := LatencyQuantile([]uint64{1, 2}, 0.99); ok {
		t.Error("a quantile of counts of another shape")
	}
}

// TestReloadsAndExpiries: the reload and expiry counters count.
func TestReloadsAndExpiries(t *testing.T) {
	g := NewGateway()
	g.Reloaded(true)
	g.Reloaded(false)
	g.Reloaded(false)
	fs := metricstest.Handler(t, g.Handler())
	if v := value(t, fs, "flashgate_gateway_config_reloads_total", "result", "error"); v != 2 {
		t.Fatalf("reloads{error} = %v", v)
	}
	if v := value(t, fs, "flashgate_gateway_config_reloads_total", "result", "ok"); v != 1 {
		t.Fatalf("reloads{ok} = %v", v)
	}
	b := NewBackend()
	b.Expired(3)
	if v := value(t, metricstest.Handler(t, b.Handler()), "flashgate_backend_orders_expired_total"); v != 3 {
		t.Fatalf("expired = %v", v)
	}
}
