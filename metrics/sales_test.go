package metrics

import (
	"runtime"
	"testing"

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
