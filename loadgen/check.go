package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/audit"
	"github.com/flashgate/flashgate/config"
)

// What follows is the end of a load: waiting for the backend to write what
// the gateway accepted, then the audit, printed. `flashgate bench`, the demo
// and the ingest bench (bench/ingest) share it.

// NewSale is a sale that starts now and lasts an hour.
func NewSale(id, title string, total, perUser, perOrder, price int64, now time.Time) *flashgate.Sale {
	start := now.Truncate(time.Second)
	return &flashgate.Sale{
		ID: id, Title: title, PriceCents: price, Total: total,
		StartsAt: start, EndsAt: start.Add(time.Hour),
		PerUserLimit: perUser, PerOrderMax: perOrder,
	}
}

// AwaitDrain audits the sale every 200 ms until every accepted order has its
// row in MySQL and Redis holds no reservation, or until timeout; then the last
// audit stands, with whatever it found lost.
func AwaitDrain(ctx context.Context, cfg config.Config, sale string, accepted []uint64, timeout time.Duration) (rep audit.Report, waited time.Duration, drained bool, err error) {
	db, err := audit.OpenDB(cfg.MySQL.DSN)
	if err != nil {
		return rep, 0, false, fmt.Errorf("mysql: %w", err)
	}
	defer db.Close()
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: cfg.Redis.Addrs, Username: cfg.Redis.Username, Password: cfg.Redis.Password, DisableCache: true})
	if err != nil {
		return rep, 0, false, fmt.Errorf("redis %v: %w", cfg.Redis.Addrs, err)
	}
	defer rc.Close()

	start := time.Now()
	deadline := start.Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		rep, err = audit.Check(cctx, db, rc, sale, accepted)
		cancel()
		if err == nil && rep.Lost == 0 && rep.RedisReserved == 0 {
			// Drained. The report that saw it read MySQL and Redis at different
			// moments, maybe across the last batch: audit the system at rest.
			waited := time.Since(start)
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			rep, err = audit.Check(cctx, db, rc, sale, accepted)
			cancel()
			return rep, waited, err == nil, err
		}
		if errors.Is(err, audit.ErrSaleNotFound) {
			return rep, time.Since(start), false, err
		}
		if !time.Now().Before(deadline) {
			return rep, time.Since(start), false, err
		}
		select {
		case <-ctx.Done():
			return rep, time.Since(start), false, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// WriteAudit prints the audit in a few aligned lines.
func WriteAudit(w io.Writer, r audit.Report, accepted int, waited time.Duration, drained bool) {
	fmt.Fprintf(w, "%-10s sale %s: total %d, sold in MySQL %d, live units %d, distinct buyers %d\n",
		"audit", r.SaleID, r.Total, r.Sold, r.LiveUnits, r.DistinctBuyers)
	statuses := make([]string, 0, len(r.ByStatus))
	for s := range r.ByStatus {
		statuses = append(statuses, s)
	}
	sort.Strings(statuses)
	parts := make([]string, len(statuses))
	for i, s := range statuses {
		parts[i] = fmt.Sprintf("%s %d", s, r.ByStatus[s])
	}
	fmt.Fprintf(w, "%-10s %d (%s)\n", "orders", r.Orders, strings.Join(parts, ", "))
	ledger := "ledger holds"
	if !r.LedgerHolds {
		ledger = fmt.Sprintf("ledger off by %d", r.LedgerDiff)
	}
	fmt.Fprintf(w, "%-10s remaining %d, reserved %d; %s (remaining + reserved + sold = total)\n",
		"redis", r.RedisRemaining, r.RedisReserved, ledger)
	fmt.Fprintf(w, "%-10s oversold %d, over-limit users %d, lost %d of %d accepted, duplicated %d\n",
		"checks", r.Oversold, r.OverLimitUsers, r.Lost, accepted, r.Duplicated)
	if drained {
		fmt.Fprintf(w, "%-10s in %.1fs\n", "drained", waited.Seconds())
	} else {
		fmt.Fprintf(w, "%-10s NOT drained after %.1fs: checked as it stands\n", "drained", waited.Seconds())
	}
}

// SummaryLine is the bench's last line. When all is well it has exactly the
// shape `demo: sold 1000/1000, orders 1000, oversold 0, over-limit users 0,
// lost 0`; whatever else went wrong is appended.
func SummaryLine(label string, r audit.Report, badOrderIDs int64) string {
	s := fmt.Sprintf("%s: sold %d/%d, orders %d, oversold %d, over-limit users %d, lost %d",
		label, r.LiveUnits, r.Total, r.Orders, r.Oversold, r.OverLimitUsers, r.Lost)
	if r.Duplicated != 0 {
		s += fmt.Sprintf(", duplicated %d", r.Duplicated)
	}
	if !r.LedgerHolds {
		s += fmt.Sprintf(", ledger off by %d", r.LedgerDiff)
	}
	if badOrderIDs != 0 {
		s += fmt.Sprintf(", 202s without order id %d", badOrderIDs)
	}
	return s
}
