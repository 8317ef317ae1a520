package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate"
)

// StatusDropped labels the outcome of a message whose order the gateway had
// already released (its publish failed and the buyer was told 503): nothing was
// written. It is not an order status.
const StatusDropped flashgate.OrderStatus = "dropped"

// other labels a status or reason outside the known sets below, which keeps
// the series of orders_total bounded whatever a caller passes.
const other = "other"

// statuses are the status label values Outcome keeps as they are.
var statuses = []flashgate.OrderStatus{
	flashgate.OrderConfirmed, flashgate.OrderFailed, StatusDropped,
	flashgate.OrderPending, flashgate.OrderPaid, flashgate.OrderCanceled,
}

// reasons are the reason label values Outcome keeps as they are: "" (none) and
// every reason an order can fail or be canceled with. "unknown_region" is the
// backend's own (backend.reasonUnknownRegion; its tests check it stays known).
var reasons = []string{
	"",
	flashgate.ReasonSoldOut,
	flashgate.ReasonLimitReached,
	flashgate.ReasonSaleClosed,
	flashgate.ReasonUnknownSale,
	"unknown_region",
	flashgate.ReasonPublishFailed,
	flashgate.ReasonAdmitFailed,
	flashgate.ReasonDeadLetter,
	flashgate.ReasonCanceled,
	flashgate.ReasonExpired,
	flashgate.ReasonBadCharges,
	flashgate.ReasonDuplicate,
	flashgate.ReasonIDTaken,
	flashgate.ReasonUnadmitted,
}

type outcomeKey struct {
	status flashgate.OrderStatus
	reason string
}

// Backend is a backend process's collectors and registry. Its methods are safe
// for concurrent use.
type Backend struct {
	reg     *prometheus.Registry
	handler http.Handler

	skew prometheus.Gauge // flashgate_redis_clock_skew_seconds

	batchSize   prometheus.Histogram
	batchTime   prometheus.Histogram
	batchFailed prometheus.Counter
	ordersVec   *prometheus.CounterVec
	orders      map[outcomeKey]prometheus.Counter // read-only after NewBackend
	knownStatus map[flashgate.OrderStatus]bool
	knownReason map[string]bool
	existing    prometheus.Counter
	pending     prometheus.Gauge
	ackPending  prometheus.Gauge
	redelivered prometheus.Counter
	mysqlErrors prometheus.Counter
	charges     prometheus.Counter
	expired     prometheus.Counter
}

// NewBackend creates the backend's collectors on a registry of its own, with
// the order outcomes that happen (confirmed, dropped, failed with each known
// reason) at zero.
func NewBackend() *Backend {
	const sub = "backend"
	m := &Backend{
		reg:         newRegistry(),
		orders:      map[outcomeKey]prometheus.Counter{},
		knownStatus: map[flashgate.OrderStatus]bool{},
		knownReason: map[string]bool{},
	}
	m.batchSize = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace, Subsystem: sub, Name: "batch_orders",
		Help:    "Orders per sale batch written (one MySQL transaction under the row guard).",
		Buckets: prometheus.ExponentialBuckets(1, 2, 14), // 1 … 8192; backend.batch_size is at most 5000
	})
	m.batchTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace, Subsystem: sub, Name: "batch_duration_seconds",
		Help:    "Time to write one sale batch: Redis claim, MySQL transaction, Redis write-back, acks.",
		Buckets: latencyBuckets[:],
	})
	m.batchFailed = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: sub, Name: "batches_failed_total",
		Help: "Sale batches that failed (MySQL or Redis): held while a dependency of the sale cannot write, else nak'ed for redelivery.",
	})
	m.ordersVec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: sub, Name: "orders_total",
		Help: "Orders decided, by status (confirmed, failed, dropped: released by the gateway before the backend saw it) and failure reason.",
	}, []string{"status", "reason"})
	m.existing = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: sub, Name: "orders_existing_total",
		Help: "Order messages whose order MySQL already held (a redelivery or a republish): written back again, not counted in orders_total.",
	})
	m.pending = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: sub, Name: "consumer_num_pending",
		Help: "Order messages not yet delivered to the durable consumer (all backends share it).",
	})
	m.ackPending = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: sub, Name: "consumer_num_ack_pending",
		Help: "Order messages delivered to the durable consumer and not yet acked.",
	})
	m.redelivered = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: sub, Name: "redeliveries_total",
		Help: "Order messages received on their second or later delivery.",
	})
	m.mysqlErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: sub, Name: "mysql_errors_total",
		Help: "Batch transactions that failed, each attempt counted (deadlocks that a retry settled included).",
	})
	m.charges = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: sub, Name: "charges_refused_total",
		Help: "Orders refused (failed, bad_charges) because their message's limit charges are not what the backend works out from the order's facts and the sale's limits: a forged or broken publisher.",
	})

	m.expired = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: sub, Name: "orders_expired_total",
		Help: "Confirmed orders canceled (reason expired) because their payment deadline passed, their units back on sale.",
	})

	for _, s := range statuses {
		m.knownStatus[s] = true
	}
	for _, r := range reasons {
		m.knownReason[r] = true
	}
	precreate := []outcomeKey{{flashgate.OrderConfirmed, ""}, {StatusDropped, ""}}
	for _, r := range reasons[1:] {
		precreate = append(precreate, outcomeKey{flashgate.OrderFailed, r})
	}
	for _, k := range precreate {
		m.orders[k] = m.ordersVec.WithLabelValues(string(k.status), k.reason)
	}

	m.skew = newSkewGauge()
	m.reg.MustRegister(m.batchSize, m.batchTime, m.batchFailed, m.ordersVec, m.existing,
		m.pending, m.ackPending, m.redelivered, m.mysqlErrors, m.charges, m.expired, m.skew)
	m.handler = handlerFor(m.reg)
	return m
}

// Registry is the backend's registry, for collectors of its own.
func (m *Backend) Registry() *prometheus.Registry { return m.reg }

// Handler serves the backend's registry: mount it at GET /metrics.
func (m *Backend) Handler() http.Handler { return m.handler }

// Batch observes one sale batch written: its orders and how long it took.
func (m *Backend) Batch(size int, d time.Duration) {
	m.batchSize.Observe(float64(size))
	m.batchTime.Observe(seconds(d))
}

// BatchFailed counts one sale batch that failed (held in an outage, else nak'ed).
func (m *Backend) BatchFailed() { m.batchFailed.Inc() }

// Outcome counts one order decided. A status or reason outside the known sets
// is counted as "other".
func (m *Backend) Outcome(status flashgate.OrderStatus, reason string) {
	k := outcomeKey{status, reason}
	if c, ok := m.orders[k]; ok {
		c.Inc()
		return
	}
	if !m.knownStatus[k.status] {
		k.status = other
	}
	if !m.knownReason[k.reason] {
		k.reason = other
	}
	// A rare pair (a failed order with a new reason, say): at most
	// len(statuses)+1 × len(reasons)+1 series.
	m.ordersVec.WithLabelValues(string(k.status), k.reason).Inc()
}

// Existing counts one message whose order MySQL already held.
func (m *Backend) Existing() { m.existing.Inc() }

// Lag records the durable consumer's num_pending and num_ack_pending.
func (m *Backend) Lag(pending uint64, ackPending int) {
	m.pending.Set(float64(pending))
	m.ackPending.Set(float64(ackPending))
}

// Redelivered counts one message received on a second or later delivery.
func (m *Backend) Redelivered() { m.redelivered.Inc() }

// MySQLError counts one failed MySQL transaction.
func (m *Backend) MySQLError() { m.mysqlErrors.Inc() }

// ChargesRefused counts an order refused for charges other than its facts make.
func (m *Backend) ChargesRefused() { m.charges.Inc() }

// Expired counts n orders expired unpaid.
func (m *Backend) Expired(n int) { m.expired.Add(float64(n)) }

// SetRedisSkew records this process's clock skew against Redis (lua.WatchSkew).
func (m *Backend) SetRedisSkew(d time.Duration) { m.skew.Set(seconds(d)) }
