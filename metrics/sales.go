package metrics

import (
	"runtime"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"time"

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

// SaleCounters count one sale's purchase answers by code on one gateway, and
// its 202s by latency, for the live view (the gateway sends them to the
// backends every second). Add and Accepted allocate nothing.
type SaleCounters struct {
	n   [len(codes)]atomic.Uint64
	lat [LatencyCounts]atomic.Uint64 // 202s by latency bucket; the last past the largest bound
}

// latencyBounds are latencyBuckets as durations, for Accepted's search.
var latencyBounds = func() (b [len(latencyBuckets)]time.Duration) {
	for i, s := range latencyBuckets {
		b[i] = time.Duration(s * float64(time.Second))
	}
	return b
}()

// Accepted counts one 202 answered d after its request arrived, in the first
// bucket whose bound d does not pass (Prometheus's le).
func (c *SaleCounters) Accepted(d time.Duration) {
	i := 0
	for i < len(latencyBounds) && d > latencyBounds[i] {
		i++
	}
	c.lat[i].Add(1)
}

// AcceptedLatency is the 202s so far by latency bucket (LatencyBounds, then
// one past the largest), nil when there were none.
func (c *SaleCounters) AcceptedLatency() []uint64 {
	var out []uint64
	for i := range c.lat {
		if v := c.lat[i].Load(); v > 0 {
			if out == nil {
				out = make([]uint64, len(c.lat))
			}
			out[i] = v
		}
	}
	return out
}

// LatencyCounts is the length of counts by latency bucket
// (SaleCounters.AcceptedLatency): one per bound of LatencyBounds, and one past
// the largest.
const LatencyCounts = len(latencyBuckets) + 1

// LatencyBounds are the upper bounds (seconds) of the latency buckets of
// SaleCounters.AcceptedLatency (and of the latency histograms): counts by
// bucket have one more entry, past the largest.
func LatencyBounds() []float64 { return slices.Clone(latencyBuckets[:]) }

// LatencyQuantile is the q-quantile (0 < q < 1), in seconds, of counts by
// bucket of LatencyBounds (one more entry, past the largest), interpolated
// linearly within its bucket as Prometheus's histogram_quantile does; a
// quantile past the largest bound is that bound. ok is false when counts hold
// nothing or are not of that shape.
func LatencyQuantile(counts []uint64, q float64) (secs float64, ok bool) {
	if len(counts) != LatencyCounts {
		return 0, false
	}
	var total uint64
	for _, n := range counts {
		total += n
	}
	if total == 0 {
		return 0, false
	}
	rank := q * float64(total)
	var seen uint64
	for i, n := range counts {
		if n == 0 || float64(seen+n) < rank {
			seen += n
			continue
		}
		if i == len(latencyBuckets) {
			return latencyBuckets[i-1], true
		}
		lo := 0.0
		if i > 0 {
			lo = latencyBuckets[i-1]
		}
		return lo + (latencyBuckets[i]-lo)*(rank-float64(seen))/float64(n), true
	}
	return latencyBuckets[len(latencyBuckets)-1], true
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
