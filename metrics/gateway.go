package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate"
)

// Route is a public API route of docs/design.md §3, the route label of requests.
type Route uint8

const (
	RouteSale     Route = iota // GET /v1/sales/{sale}
	RoutePurchase              // POST /v1/sales/{sale}/orders
	RouteOrder                 // GET /v1/sales/{sale}/orders/{order}
	RoutePay                   // POST …/orders/{order}/pay
	RouteCancel                // POST …/orders/{order}/cancel
	RoutePayment               // POST /v1/payments
	RouteOther                 // anything else: unknown paths and methods
	numRoutes
)

var routeNames = [numRoutes]string{"sale", "purchase", "order", "pay", "cancel", "payment", "other"}

// String is the route's label value; an out-of-range route is "other".
func (r Route) String() string {
	if r >= numRoutes {
		r = RouteOther
	}
	return routeNames[r]
}

// Limit is a local limit of the gateway, the limit label of refusals.
type Limit uint8

const (
	LimitIP       Limit = iota // per client IP rate
	LimitUser                  // per JWT subject rate
	LimitSale                  // per sale admission rate
	LimitInflight              // max_inflight concurrent requests
	LimitConns                 // connection limits
	LimitView                  // per JWT subject rate of order reads
	numLimits
)

var limitNames = [numLimits]string{"ip", "user", "sale", "inflight", "conns", "view"}

// String is the limit's label value; an out-of-range limit is "other".
func (l Limit) String() string {
	if l >= numLimits {
		return "other"
	}
	return limitNames[l]
}

// CodeOK labels a success whose body carries no code of its own (the 200 of
// GET sale, GET order, pay and cancel). It is not a docs/design.md §3 code.
const CodeOK flashgate.Code = "ok"

// codeOther labels any code the list below does not know, so a new code costs
// no allocation and no unbounded series before it is added here.
const codeOther flashgate.Code = "other"

// codes are the code label values, each with series for every route, in the
// order of codeIdx. The last is codeOther.
var codes = [...]flashgate.Code{
	CodeOK,
	flashgate.CodeAccepted,
	flashgate.CodeInvalidRequest,
	flashgate.CodeUnauthorized,
	flashgate.CodeLimitReached,
	flashgate.CodeSaleNotFound,
	flashgate.CodeOrderNotFound,
	flashgate.CodeSoldOut,
	flashgate.CodeEnded,
	flashgate.CodeBodyTooLarge,
	flashgate.CodeNotStarted,
	flashgate.CodeRateLimited,
	flashgate.CodeUnavailable,
	flashgate.CodeConflict,
	flashgate.CodeOrderClosed,
	flashgate.CodeInternal,
	flashgate.CodeForbidden,
	flashgate.CodeBadSignature,
	flashgate.CodeAmountMismatch,
	flashgate.CodeAlreadyPaid,
	flashgate.CodePaymentIDUsed,
	flashgate.CodePaused,
	codeOther,
}

// codeIdx is the place of c in codes, that of codeOther for a code codes does
// not list. A switch, not a map: it compiles to a search on length and bytes,
// several times faster than hashing (TestCodesCoverDomain keeps it and codes in
// step).
func codeIdx(c flashgate.Code) uint8 {
	switch c {
	case CodeOK:
		return 0
	case flashgate.CodeAccepted:
		return 1
	case flashgate.CodeInvalidRequest:
		return 2
	case flashgate.CodeUnauthorized:
		return 3
	case flashgate.CodeLimitReached:
		return 4
	case flashgate.CodeSaleNotFound:
		return 5
	case flashgate.CodeOrderNotFound:
		return 6
	case flashgate.CodeSoldOut:
		return 7
	case flashgate.CodeEnded:
		return 8
	case flashgate.CodeBodyTooLarge:
		return 9
	case flashgate.CodeNotStarted:
		return 10
	case flashgate.CodeRateLimited:
		return 11
	case flashgate.CodeUnavailable:
		return 12
	case flashgate.CodeConflict:
		return 13
	case flashgate.CodeOrderClosed:
		return 14
	case flashgate.CodeInternal:
		return 15
	case flashgate.CodeForbidden:
		return 16
	case flashgate.CodeBadSignature:
		return 17
	case flashgate.CodeAmountMismatch:
		return 18
	case flashgate.CodeAlreadyPaid:
		return 19
	case flashgate.CodePaymentIDUsed:
		return 20
	case flashgate.CodePaused:
		return 21
	}
	return uint8(len(codes) - 1)
}

// Breaker states as BreakerState takes them.
const (
	BreakerClosed   = 0
	BreakerHalfOpen = 1
	BreakerOpen     = 2
)

// Gateway is a gateway process's collectors and registry. Its methods are safe
// for concurrent use; those called per request allocate nothing.
type Gateway struct {
	reg     *prometheus.Registry
	handler http.Handler

	skew prometheus.Gauge // flashgate_redis_clock_skew_seconds

	requests      [numRoutes][len(codes)]prometheus.Counter // [route][codeIdx]
	refusals      [numLimits]prometheus.Counter
	admit         prometheus.Histogram
	publish       prometheus.Histogram
	inflight      prometheus.Gauge
	breakers      *prometheus.GaugeVec
	soldOutMarks  prometheus.Gauge
	soldOutMarked prometheus.Counter
	releaseDepth  prometheus.Gauge
	releaseLost   prometheus.Counter
	reloads       [2]prometheus.Counter // [0] ok, [1] error
}

// NewGateway creates the gateway's collectors, every requests and refusals
// series at zero, on a registry of its own.
func NewGateway() *Gateway {
	const sub = "gateway"
	m := &Gateway{reg: newRegistry()}

	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: sub, Name: "requests_total",
		Help: "Requests answered, by route and docs/design.md §3 code (ok: a success with no code of its own; other: a code this build does not know).",
	}, []string{"route", "code"})
	for r := range numRoutes {
		for i, c := range codes {
			m.requests[r][i] = requests.WithLabelValues(r.String(), string(c))
		}
	}

	refusals := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: sub, Name: "limiter_refusals_total",
		Help: "Requests a local limit refused, by limit.",
	}, []string{"limit"})
	for l := range numLimits {
		m.refusals[l] = refusals.WithLabelValues(l.String())
	}

	m.admit = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace, Subsystem: sub, Name: "admit_duration_seconds",
		Help:    "Latency of the atomic admission (the Lua call on the sale's Redis shard).",
		Buckets: latencyBuckets[:],
	})
	m.publish = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace, Subsystem: sub, Name: "publish_duration_seconds",
		Help:    "Latency of publishing an admitted order to JetStream, until its ack.",
		Buckets: latencyBuckets[:],
	})
	m.inflight = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: sub, Name: "inflight",
		Help: "Requests past pre-validation and not yet answered (ratelimit.max_inflight bounds it).",
	})
	m.breakers = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: sub, Name: "breaker_state",
		Help: "Circuit breaker state: 0 closed, 1 half-open, 2 open.",
	}, []string{"breaker"})
	m.soldOutMarks = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: sub, Name: "soldout_marks",
		Help: "Sale and sale/region sold-out marks held in memory, answering 409 without Redis.",
	})
	m.soldOutMarked = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: sub, Name: "soldout_marked_total",
		Help: "Sold-out marks set.",
	})

	m.releaseDepth = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: sub, Name: "release_queue_depth",
		Help: "Reservations of failed admissions or publishes waiting for a release worker.",
	})
	m.releaseLost = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: sub, Name: "release_overflow_total",
		Help: "Releases the full queue could not take; reconcile finds those reservations.",
	})

	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: sub, Name: "config_reloads_total",
		Help: "Configuration reloads (SIGHUP or the file changed), by result: ok (the new rate limits are in force) or error (the limits in force stay).",
	}, []string{"result"})
	m.reloads[0], m.reloads[1] = reloads.WithLabelValues("ok"), reloads.WithLabelValues("error")

	m.skew = newSkewGauge()
	m.reg.MustRegister(reloads, requests, refusals, m.admit, m.publish, m.inflight, m.breakers, m.soldOutMarks, m.soldOutMarked,
		m.releaseDepth, m.releaseLost, m.skew)
	m.handler = handlerFor(m.reg)
	return m
}

// Registry is the gateway's registry, for collectors of its own.
func (m *Gateway) Registry() *prometheus.Registry { return m.reg }

// Handler serves the gateway's registry: mount it at GET /metrics.
func (m *Gateway) Handler() http.Handler { return m.handler }

// Request counts one answered request. An out-of-range route counts as
// RouteOther, an unknown code as "other".
func (m *Gateway) Request(r Route, code flashgate.Code) {
	if r >= numRoutes {
		r = RouteOther
	}
	m.requests[r][codeIdx(code)].Inc()
}

// AdmitLatency observes one admission call.
func (m *Gateway) AdmitLatency(d time.Duration) { m.admit.Observe(seconds(d)) }

// PublishLatency observes one JetStream publish, until its ack (or failure).
func (m *Gateway) PublishLatency(d time.Duration) { m.publish.Observe(seconds(d)) }

// Refused counts one refusal by a local limit. An out-of-range limit is dropped.
func (m *Gateway) Refused(l Limit) {
	if l < numLimits {
		m.refusals[l].Inc()
	}
}

// InflightAdd moves the in-flight gauge by n (+1 on entry, -1 on answer).
func (m *Gateway) InflightAdd(n int) { m.inflight.Add(float64(n)) }

// BreakerState records a breaker's state (BreakerClosed, BreakerHalfOpen,
// BreakerOpen). It looks the series up by name, which allocates: call it on
// state changes, not per request.
func (m *Gateway) BreakerState(name string, state int) {
	m.breakers.WithLabelValues(name).Set(float64(state))
}

// SoldOutMarks sets how many sold-out marks the gateway holds.
func (m *Gateway) SoldOutMarks(n int) { m.soldOutMarks.Set(float64(n)) }

// SoldOutMarked counts one sold-out mark set.
func (m *Gateway) SoldOutMarked() { m.soldOutMarked.Inc() }

// ReleaseQueued moves the release queue's depth by n (+1 queued, -1 taken).
func (m *Gateway) ReleaseQueued(n int) { m.releaseDepth.Add(float64(n)) }

// ReleaseOverflow counts one release the full queue refused.
func (m *Gateway) ReleaseOverflow() { m.releaseLost.Inc() }

// Reloaded counts one configuration reload, ok or not.
func (m *Gateway) Reloaded(ok bool) {
	if ok {
		m.reloads[0].Inc()
	} else {
		m.reloads[1].Inc()
	}
}

// SetRedisSkew records this process's clock skew against Redis (lua.WatchSkew).
func (m *Gateway) SetRedisSkew(d time.Duration) { m.skew.Set(seconds(d)) }
