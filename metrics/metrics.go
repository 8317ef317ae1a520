// Package metrics owns what flashgate tells Prometheus and pprof: the
// collectors of the gateway (requests by route and code, admission and
// JetStream publish latency, limiter refusals, breakers, in-flight requests,
// sold-out marks, config reloads) and of the backend (batches, order outcomes,
// consumer lag, redeliveries, MySQL errors, expiries), the leader's per-sale
// gauges (sales.go: remaining, reserved, sold, pending, the conservation
// error), flashgate_build_info, each process's own registry and the handlers
// that serve them on the admin ports (docs/design.md §4, docs/observability.md).
//
// Every Gateway and Backend has its own *prometheus.Registry, never the global
// one: tests run several of each in one process. The methods the gateway calls
// per request allocate nothing: every series they touch is created up front and
// picked by array index (the hot path of docs/gateway.md allocates nothing).
package metrics

import (
	"log/slog"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// namespace prefixes every flashgate series.
const namespace = "flashgate"

// latencyBuckets (seconds) span 50µs, a local Redis round trip, to 5s, far past
// any timeout the edge allows: 1-2.5-5 steps so dashboards read round numbers.
var latencyBuckets = [...]float64{
	50e-6, 100e-6, 250e-6, 500e-6,
	1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3,
	1, 2.5, 5,
}

// newRegistry is a process's registry with the Go runtime, process and build
// collectors.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector(),
		newBuildInfo(),
	)
	return reg
}

// handlerFor serves reg in the Prometheus exposition formats. A collector that
// fails is logged and left out rather than failing the whole scrape; the
// handler's own requests are counted in reg (promhttp_metric_handler_*).
func handlerFor(reg *prometheus.Registry) http.Handler {
	return promhttp.InstrumentMetricHandler(reg, promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(slog.Default().Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      reg,
	}))
}

// newSkewGauge is flashgate_redis_clock_skew_seconds, which every process
// exports (invariant 8): its clock less Redis's, sampled with TIME and half
// the round trip (lua.WatchSkew), the node of the largest skew. The gateway
// and the backend both export it under this one name (their job label tells
// them apart), so one alert rule covers every process.
func newSkewGauge() prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Name: "redis_clock_skew_seconds",
		Help: "This process's clock less Redis's (TIME, corrected by half the round trip; the node of the largest skew). Positive: this process is ahead. No correctness decision uses this process's clock; past 1s the FlashgateClockSkew alert fires.",
	})
}

// seconds is d as Prometheus wants it.
func seconds(d time.Duration) float64 { return d.Seconds() }

// PprofHandler serves net/http/pprof under /debug/pprof/. Mount it on an admin
// mux at that prefix:
//
//	mux.Handle("/debug/pprof/", metrics.PprofHandler())
//
// Profiles expose internals (command line, heap contents, goroutine stacks):
// serve it only on a loopback or otherwise private admin port, behind the admin
// token where there is one. The CPU profile and the trace run for ?seconds=
// (default 30); pprof extends the server's write deadline by as much. A
// ?seconds= over MaxPprofSeconds is refused 400 before anything starts: a
// profile of an hour would hold a connection, and the CPU profiler, for that
// hour.
//
// (Importing net/http/pprof also registers these routes on
// http.DefaultServeMux; flashgate never serves that mux.)
func PprofHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index) // the index and every named profile (heap, goroutine, allocs…)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.FormValue("seconds"); v != "" { // what pprof reads
			if s, err := strconv.ParseFloat(v, 64); err != nil || !(s <= MaxPprofSeconds) {
				http.Error(w, "seconds: at most "+strconv.Itoa(MaxPprofSeconds), http.StatusBadRequest)
				return
			}
		}
		mux.ServeHTTP(w, r)
	})
}

// MaxPprofSeconds bounds pprof's ?seconds= (CPU profile, trace, delta profiles).
const MaxPprofSeconds = 60
