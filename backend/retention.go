package backend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/tick"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
)

// Retention (docs/retention.md). Redis holds what admission needs; once a sale
// is over and settled nothing reads its keys but the order-status GET, which
// MySQL answers as well. So the leader removes a sale from Redis
// sales.retention after it ended (or closed, if earlier), provided it is
// settled: no order still unpaid within, or past, its payment deadline (the
// sweeper would write its restock back), no reservation open in Redis and no
// order message in the stream. MySQL keeps the sale and its orders for good
// and records when it was retired; a retired sale is never warmed again.

// retireEvery is how often the leader looks for sales to retire; 0: the
// leader does not (this package's tests call retireSales with their own clock).
var retireEvery = time.Minute

// retirePage is how many candidate sales one query reads.
const retirePage = 500

type retentionMetrics struct {
	retired prometheus.Counter
	held    prometheus.Gauge
}

func newRetentionMetrics(reg prometheus.Registerer) *retentionMetrics {
	const ns, sub = "flashgate", "backend"
	m := &retentionMetrics{
		retired: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "sales_retired_total",
			Help: "Sales the leader removed from Redis after sales.retention (ended or closed, and settled)."}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "sales_retention_held",
			Help: "Sales past sales.retention kept in Redis at the last pass because they are not settled."}),
	}
	reg.MustRegister(m.retired, m.held)
	return m
}

// retainer is the leader's retention pass: it reads MySQL, the sale's Redis
// keys and the stream's count of its messages, and removes a settled sale.
type retainer struct {
	db        *sql.DB
	rc        rueidis.Client
	nc        *nats.Conn // nil: no retired event (tests)
	nats      config.NATS
	retention time.Duration
	log       *slog.Logger
	metrics   *retentionMetrics // nil in tests
	stream    *orderStream      // its count of the sale's messages
}

// RetireReport is what one retention pass did.
type RetireReport struct {
	Retired []string          // removed from Redis now
	Held    map[string]string // past retention but not settled: why
}

// retireLoop runs a retention pass every retireEvery until ctx (the leader
// lock's) ends. The first pass also scores in the live index the sales warmed
// before it existed, so that gateways' refresh sees them.
func (r *retainer) retireLoop(ctx context.Context) {
	if n, err := lua.BackfillLive(ctx, r.rc); err != nil {
		r.log.Warn("retention: backfilling the live sales index", "err", err)
	} else if n > 0 {
		r.log.Info("retention: sales added to the live index", "sales", n)
	}
	tick.Every(ctx, retireEvery, func(time.Time) {
		rep, err := r.retireSales(ctx, time.Now())
		if err != nil && ctx.Err() == nil {
			r.log.Warn("retention pass", "err", err)
		}
		if len(rep.Retired) > 0 {
			r.log.Info("sales retired from redis", "sales", len(rep.Retired), "held", len(rep.Held))
		}
	})
}

// retireSales retires every sale that ended or closed sales.retention before
// now and is settled. An error on one sale is reported after the others are
// done.
func (r *retainer) retireSales(ctx context.Context, now time.Time) (RetireReport, error) {
	rep := RetireReport{Held: map[string]string{}}
	cutoff := now.Add(-r.retention).UTC()
	var errs []error
	after, afterID := time.Unix(0, 0).UTC(), ""
	for {
		ids, last, lastID, err := mysql.RetireCandidates(ctx, r.db, cutoff, after, afterID, retirePage)
		if err != nil {
			return rep, errors.Join(append(errs, err)...)
		}
		for _, id := range ids {
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			why, err := r.unsettled(ctx, id)
			if err == nil && why == "" {
				err = r.retire(ctx, id, now)
			}
			switch {
			case err != nil:
				errs = append(errs, err)
			case why != "":
				rep.Held[id] = why
			default:
				rep.Retired = append(rep.Retired, id)
			}
		}
		if len(ids) < retirePage {
			break
		}
		after, afterID = last, lastID
	}
	if r.metrics != nil {
		r.metrics.held.Set(float64(len(rep.Held)))
		r.metrics.retired.Add(float64(len(rep.Retired)))
	}
	return rep, errors.Join(errs...)
}

// unsettled answers why the sale cannot leave Redis yet ("" when it can).
func (r *retainer) unsettled(ctx context.Context, id string) (string, error) {
	// An unpaid order, even past its deadline: the sweeper will cancel it and
	// restock its units into Redis. (pending: written by nothing today, but
	// not final either.)
	open, err := mysql.UnpaidOrders(ctx, r.db, id)
	if err != nil {
		return "", fmt.Errorf("retention %s: orders: %w", id, err)
	}
	if open > 0 {
		return fmt.Sprintf("%d orders unpaid", open), nil
	}
	var resv int64
	k, err := keysOf(ctx, r.db, id)
	if err == nil {
		// Every bucket's, for a split sale.
		for _, b := range append([]*lua.Keys{k}, k.Buckets()...) {
			n, herr := r.rc.Do(ctx, r.rc.B().Hlen().Key(b.Resv).Build()).AsInt64()
			resv, err = resv+n, herr
			if err != nil {
				break
			}
		}
	}
	if err != nil {
		return "", fmt.Errorf("retention %s: reservations: %w", id, err)
	}
	if resv > 0 {
		return fmt.Sprintf("%d reservations open", resv), nil
	}
	// Read after the reservations: an admission's message is published after
	// its reservation is written and acked after it is settled, so an order
	// is seen in one or the other.
	inFlight, err := r.stream.streamCount(ctx, id)
	if err != nil {
		return "", fmt.Errorf("retention %s: %w", id, err)
	}
	if inFlight > 0 {
		return fmt.Sprintf("%d order messages in the stream", inFlight), nil
	}
	return "", nil
}

// retire removes the sale from Redis, then records it in MySQL. A crash in
// between leaves the sale a candidate: the next pass deletes nothing more and
// records it.
func (r *retainer) retire(ctx context.Context, id string, now time.Time) error {
	row, err := loadSale(ctx, r.db, id)
	if err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	keys, err := lua.Retire(ctx, r.rc, &row.Sale)
	if err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	if err := mysql.MarkRetired(ctx, r.db, id, now); err != nil {
		return fmt.Errorf("retention %s: %w", id, err)
	}
	r.log.Debug("sale retired from redis", "sale", id, "keys", keys)
	// Gateways forget a sale once it is live_grace past its end; this tells
	// them now, for a sale closed early. A lost event leaves it answering 410
	// from memory until then.
	if r.nc != nil {
		if err := bus.PublishEvent(r.nc, r.nats, bus.SaleEvent{Type: bus.EventRetired, SaleID: id}); err != nil {
			r.log.Warn("retired event", "sale", id, "err", err)
		}
	}
	return nil
}

// retired reports whether retention removed sale from Redis, for the Redis
// write-backs of a repeated pay or cancel, which would bring a key of it back.
// Unknown (MySQL failed) counts as not retired: the write-back heals more than
// a stray key costs.
func retired(ctx context.Context, db *sql.DB, sale string) bool {
	at, err := saleRetired(ctx, db, sale)
	return err == nil && at != nil
}

// saleRetired reports when the sale left Redis for good (nil: it has not).
func saleRetired(ctx context.Context, q queryer, id string) (*time.Time, error) {
	return mysql.SaleRetired(ctx, q, id)
}
