package metrics

import (
	"runtime"
	"runtime/debug"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate"
)

// StampedVersion and StampedCommit are what `make build` writes into the
// binary (-ldflags -X, as it does for `flashgate version`): the build's
// version and commit when it carries no VCS information of its own.
var StampedVersion, StampedCommit string

// BuildInfo is the module version, the VCS commit and the Go version the
// binary was built from, as flashgate_build_info's labels and `flashgate
// version` print them.
func BuildInfo() (version, commit, goVersion string) {
	version, commit, goVersion = "(devel)", "unknown", runtime.Version()
	if StampedVersion != "" {
		version = StampedVersion
	}
	if StampedCommit != "" {
		commit = StampedCommit
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		version = v
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			commit = s.Value
		}
	}
	return
}

// newBuildInfo is flashgate_build_info: always 1, its labels say what runs.
func newBuildInfo() prometheus.Collector {
	v, c, g := BuildInfo()
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Name: "build_info",
		Help:        "Always 1: the version, VCS commit and Go version of the running binary.",
		ConstLabels: prometheus.Labels{"version": v, "commit": c, "goversion": g},
	})
	gauge.Set(1)
	return gauge
}

// SaleState is one sale's books at one moment, as the leader backend reads
// them every second (docs/observability.md).
type SaleState struct {
	Total     int64 // sales.total
	Remaining int64 // stock left in Redis, all regions
	Reserved  int64 // units of open reservations in Redis (admitted, not yet settled)
	Sold      int64 // sales.sold in MySQL
	Pending   int64 // order messages of the sale still in the JetStream stream
	// Conservation is remaining + reserved + sold − total: 0 when every unit is
	// in exactly one place (docs/design.md §2, invariant 3).
	Conservation int64
}

// Sales are the per-sale gauges the leader backend sets. Only the leader sets
// them; a backend that loses the lead drops them (Reset), so a sum over
// backends never counts a sale twice.
type Sales struct {
	total, remaining, reserved, sold, pending, conservation *prometheus.GaugeVec
}

// NewSales registers the per-sale gauges on reg.
func NewSales(reg prometheus.Registerer) *Sales {
	vec := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Subsystem: "sale", Name: name, Help: help}, []string{"sale"})
	}
	s := &Sales{
		total:     vec("total_units", "The sale's units (sales.total in MySQL)."),
		remaining: vec("remaining_units", "Units left to admit: the stock keys in Redis, all regions."),
		reserved:  vec("reserved_units", "Units of open reservations in Redis: admitted, not yet written by the backend."),
		sold:      vec("sold_units", "Units sold in MySQL (sales.sold: confirmed and paid orders)."),
		pending:   vec("pending_orders", "Order messages of the sale in the JetStream stream, not yet written to MySQL."),
		conservation: vec("conservation_error_units",
			"remaining + reserved + sold − total: 0 when every unit is in exactly one place (invariant 3). Moments of traffic make it move briefly; one that stays non-zero is a broken ledger for reconcile."),
	}
	reg.MustRegister(s.total, s.remaining, s.reserved, s.sold, s.pending, s.conservation)
	return s
}

// Set records sale's state.
func (s *Sales) Set(sale string, st SaleState) {
	s.total.WithLabelValues(sale).Set(float64(st.Total))
	s.remaining.WithLabelValues(sale).Set(float64(st.Remaining))
	s.reserved.WithLabelValues(sale).Set(float64(st.Reserved))
	s.sold.WithLabelValues(sale).Set(float64(st.Sold))
	s.pending.WithLabelValues(sale).Set(float64(st.Pending))
	s.conservation.WithLabelValues(sale).Set(float64(st.Conservation))
}

// Forget drops sale's series (a sale no longer recent).
func (s *Sales) Forget(sale string) {
	for _, v := range []*prometheus.GaugeVec{s.total, s.remaining, s.reserved, s.sold, s.pending, s.conservation} {
		v.DeleteLabelValues(sale)
	}
}

// Reset drops every sale's series (the backend is no longer the leader).
func (s *Sales) Reset() {
	for _, v := range []*prometheus.GaugeVec{s.total, s.remaining, s.reserved, s.sold, s.pending, s.conservation} {
		v.Reset()
	}
}

// SaleCounters count one sale's purchase answers by code on one gateway, for
// the live view (the gateway sends them to the backends every second). Add
// allocates nothing.
type SaleCounters struct {
	n [len(codes)]atomic.Uint64
}

// Add counts one purchase answered with code.
func (c *SaleCounters) Add(code flashgate.Code) { c.n[codeIdx(code)].Add(1) }

// Snapshot is the counts so far by code, without the codes never answered.
func (c *SaleCounters) Snapshot() map[string]uint64 {
	out := map[string]uint64{}
	for i := range c.n {
		if v := c.n[i].Load(); v > 0 {
			out[string(codes[i])] = v
		}
	}
	return out
}
