package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/audit"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/mysql"
)

// What follows is around a load: the sale it runs on, waiting for that sale to
// reach the gateways, and at the end waiting for the backend to write what the
// gateway accepted, then the audit, printed. `flashgate bench`, the demo and
// the ingest bench (bench/ingest) share it.

// NewSale is a sale that starts now and lasts an hour.
func NewSale(id, title string, total, perUser, perOrder, price int64, now time.Time) *flashgate.Sale {
	start := now.Truncate(time.Second)
	return &flashgate.Sale{
		ID: id, Title: title, PriceCents: price, Total: total,
		StartsAt: start, EndsAt: start.Add(time.Hour),
		PerUserLimit: perUser, PerOrderMax: perOrder,
	}
}

// AwaitActive waits until the target's public API shows the new sale active,
// so that the first requests do not race the sale's way to the gateways. A
// sale that does not show up in time is reported, and the load runs anyway.
func AwaitActive(ctx context.Context, target, sale string, timeout time.Duration, stderr io.Writer) {
	u := strings.TrimSuffix(target, "/") + "/v1/sales/" + url.PathEscape(sale)
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(timeout)
	last := "no answer"
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			fmt.Fprintf(stderr, "warning: %v\n", err)
			return
		}
		if resp, err := hc.Do(req); err != nil {
			last = err.Error()
		} else {
			var info struct {
				State string `json:"state"`
			}
			err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&info)
			resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusOK && info.State == string(flashgate.SaleActive):
				return
			case err != nil:
				last = fmt.Sprintf("%d, %v", resp.StatusCode, err)
			default:
				last = fmt.Sprintf("%d, state %q", resp.StatusCode, info.State)
			}
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(stderr, "warning: sale %s not active at %s after %s (%s); running anyway\n", sale, u, timeout, last)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// AwaitDrain audits the sale every 200 ms until every accepted order has its
// row in MySQL and Redis holds no reservation, or until timeout; then the last
// audit stands, with whatever it found lost.
func AwaitDrain(ctx context.Context, cfg config.Config, sale string, accepted []uint64, timeout time.Duration) (rep audit.Report, waited time.Duration, drained bool, err error) {
	db, err := mysql.OpenDB(cfg.MySQL.DSN)
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
