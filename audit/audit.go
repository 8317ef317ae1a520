// Package audit proves docs/design.md §2 for one sale from the outside: it reads MySQL
// (the source of truth) and Redis and reports every unit oversold, every buyer over
// the limit, every accepted order without a row, every unit counted twice, and
// whether Redis remaining + reserved + MySQL sold equals the sale's total. It writes
// nothing. `flashgate bench`, the demo and the tests call Check after the system
// has drained; the backend's admin ledger reuses Ledger for its invariant part.
package audit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
)

// ErrSaleNotFound is returned for a sale MySQL does not know.
var ErrSaleNotFound = errors.New("sale not found")

// Report is what Check found for one sale. Every count that measures a breakage
// is zero for a healthy sale.
type Report struct {
	SaleID string `json:"sale_id"`
	// Total and Sold are sales.total and sales.sold.
	Total int64 `json:"total"`
	Sold  int64 `json:"sold"`
	// LiveUnits is the sum of quantity over confirmed and paid orders.
	LiveUnits int64 `json:"live_units"`
	// Orders counts the sale's rows; ByStatus splits them by status.
	Orders   int64            `json:"orders"`
	ByStatus map[string]int64 `json:"by_status"`

	// Oversold is max(0, LiveUnits-Total) plus, per region, the live units
	// beyond the region's total (invariant 1).
	Oversold int64 `json:"oversold"`
	// OverLimitUsers counts users whose live units exceed per_user_limit (invariant 2).
	OverLimitUsers int64 `json:"over_limit_users"`
	// OverLimitSubjects counts the (limit, window, subject) counters of the
	// sale's purchase limits whose live orders exceed the limit's max.
	OverLimitSubjects int64 `json:"over_limit_subjects"`
	// Lost counts accepted order ids with no orders row (invariant 3).
	Lost int64 `json:"lost"`
	// Duplicated counts units counted twice (or not at all) by the counters:
	// |sales.sold − LiveUnits| + Σ over regions |sale_regions.sold − that region's
	// live units| + Σ over users |user_purchases.units − that user's live units|
	// + Σ over limit counters |limit_usage.used − what live orders charge it|
	// (invariant 4).
	Duplicated int64 `json:"duplicated"`

	// RedisRemaining is the stock left in Redis (all regions); RedisReserved the
	// units of open reservations (admitted, not yet settled by the backend).
	RedisRemaining int64 `json:"redis_remaining"`
	RedisReserved  int64 `json:"redis_reserved"`
	// LedgerDiff is RedisRemaining + RedisReserved + Sold − Total; the ledger
	// holds when it is zero (invariant 3).
	LedgerHolds bool  `json:"ledger_holds"`
	LedgerDiff  int64 `json:"ledger_diff"`

	// DistinctBuyers counts users with at least one live order.
	DistinctBuyers int64 `json:"distinct_buyers"`
}

// OK reports whether the sale keeps every invariant of docs/design.md §2.
func (r Report) OK() bool {
	return r.Oversold == 0 && r.OverLimitUsers == 0 && r.OverLimitSubjects == 0 && r.Lost == 0 && r.Duplicated == 0 && r.LedgerHolds
}

// String is a one-line summary for logs and the CLI.
func (r Report) String() string {
	return fmt.Sprintf("sale %s: total=%d sold=%d live=%d orders=%d %v oversold=%d over_limit_users=%d over_limit_subjects=%d lost=%d duplicated=%d redis_remaining=%d redis_reserved=%d ledger_diff=%d buyers=%d ok=%t",
		r.SaleID, r.Total, r.Sold, r.LiveUnits, r.Orders, r.ByStatus, r.Oversold, r.OverLimitUsers, r.OverLimitSubjects, r.Lost,
		r.Duplicated, r.RedisRemaining, r.RedisReserved, r.LedgerDiff, r.DistinctBuyers, r.OK())
}

// Check audits saleID. accepted lists the order ids the gateway answered 202
// for (nil when the caller does not know them: Lost is then 0). It is exact
// once the system has drained; during traffic the Redis and MySQL reads are
// different moments. Each invariant is its own function below.
func Check(ctx context.Context, db *sql.DB, rc rueidis.Client, saleID string, accepted []uint64) (Report, error) {
	r := Report{SaleID: saleID, ByStatus: map[string]int64{}}
	l, err := mysql.SaleLedger(ctx, db, saleID)
	if errors.Is(err, mysql.ErrSaleNotFound) {
		return r, fmt.Errorf("audit %s: %w", saleID, ErrSaleNotFound)
	}
	if err != nil {
		return r, fmt.Errorf("audit %s: %w", saleID, err)
	}
	r.Total, r.Sold = l.Total, l.Sold
	countOrders(l, &r)
	checkSold(l, &r)
	checkRegions(l, &r)
	checkBuyers(l, &r)
	if l.Limits != nil {
		checkLimits(l, &r)
	}
	if r.Lost, err = lost(ctx, db, accepted); err != nil {
		return r, fmt.Errorf("audit %s: accepted: %w", saleID, err)
	}
	if err := checkRedis(ctx, rc, l, &r); err != nil {
		return r, fmt.Errorf("audit %s: redis: %w", saleID, err)
	}
	return r, nil
}

// countOrders fills the orders per status and the live units.
func countOrders(l *mysql.Ledger, r *Report) {
	for st, c := range l.ByStatus {
		r.ByStatus[st], r.Orders = c.Orders, r.Orders+c.Orders
		if flashgate.OrderStatus(st) == flashgate.OrderConfirmed || flashgate.OrderStatus(st) == flashgate.OrderPaid {
			r.LiveUnits += c.Units
		}
	}
}

// checkSold: no unit sold beyond the total (invariant 1), and sales.sold
// counts each live unit once (invariant 4).
func checkSold(l *mysql.Ledger, r *Report) {
	r.Oversold = max(0, r.LiveUnits-r.Total)
	r.Duplicated = abs(r.Sold - r.LiveUnits)
}

// checkRegions: each region's live units within its total, and counted once
// by sale_regions.sold. Live units in a region the sale does not have are all
// too many.
func checkRegions(l *mysql.Ledger, r *Report) {
	for _, g := range l.Regions {
		r.Oversold += max(0, g.Live-g.Total)
		r.Duplicated += abs(g.Sold - g.Live)
	}
}

// checkBuyers: no buyer over the per-user limit (invariant 2), and each
// buyer's live units, and the units of the orders they canceled (whose
// quota is kept), counted once by user_purchases.
func checkBuyers(l *mysql.Ledger, r *Report) {
	for _, c := range l.Buyers {
		if c.Live > 0 {
			r.DistinctBuyers++
		}
		if c.Live > l.PerUserLimit {
			r.OverLimitUsers++
		}
		r.Duplicated += abs(c.Counted - c.Live - c.Kept)
	}
}

// checkLimits: what the live orders charge each purchase-limit counter
// within the limit (OverLimitSubjects), and counted once by limit_usage
// (Duplicated).
func checkLimits(l *mysql.Ledger, r *Report) {
	for k, c := range l.Usage {
		if c.Live != 0 && (k.Lim >= len(l.Limits) || c.Live > l.Limits[k.Lim].Max) {
			r.OverLimitSubjects++
		}
		r.Duplicated += abs(c.Counted - c.Live)
	}
}

// checkRedis: Redis remaining + reserved + MySQL sold equals the total
// (invariant 3).
func checkRedis(ctx context.Context, rc rueidis.Client, l *mysql.Ledger, r *Report) error {
	names := make([]string, 0, len(l.Regions))
	for name := range l.Regions {
		names = append(names, name)
	}
	red, err := RedisLedger(ctx, rc, r.SaleID, names)
	if err != nil {
		return err
	}
	r.RedisRemaining, r.RedisReserved = red.Remaining, red.Reserved
	r.LedgerDiff = r.RedisRemaining + r.RedisReserved + r.Sold - r.Total
	r.LedgerHolds = r.LedgerDiff == 0
	return nil
}

// Redis is the Redis side of a sale's ledger.
type Redis struct {
	// Warm is false when Redis holds no stock key of the sale.
	Warm bool `json:"warm"`
	// Remaining is the stock left, over all regions; ByRegion splits it (absent
	// for a sale without regions).
	Remaining int64            `json:"remaining"`
	ByRegion  map[string]int64 `json:"by_region,omitempty"`
	// Reserved is the units of open reservations, Reservations their count.
	Reserved     int64 `json:"reserved"`
	Reservations int64 `json:"reservations"`
}

// RedisLedger reads a sale's stock keys and open reservations. regions are the
// sale's regions (none for a sale without regions).
func RedisLedger(ctx context.Context, rc rueidis.Client, saleID string, regions []string) (Redis, error) {
	var l Redis
	tags, err := lua.BucketTagsOf(ctx, rc, saleID)
	if err != nil {
		return l, err
	}
	k := lua.BucketedKeysFor(saleID, regions, tags)
	rem, err := lua.Remaining(ctx, rc, k)
	if err != nil {
		return l, err
	}
	for region, n := range rem {
		l.Warm = true
		l.Remaining += n
		if region != "" {
			if l.ByRegion == nil {
				l.ByRegion = make(map[string]int64, len(rem))
			}
			l.ByRegion[region] = n
		}
	}
	resv, err := lua.Reservations(ctx, rc, k)
	if err != nil {
		return l, err
	}
	for _, rec := range resv {
		l.Reserved += rec.Quantity
	}
	l.Reservations = int64(len(resv))
	return l, nil
}

// lost counts the accepted order ids with no orders row (invariant 3).
func lost(ctx context.Context, db *sql.DB, accepted []uint64) (int64, error) {
	want := make(map[uint64]struct{}, len(accepted))
	for _, id := range accepted {
		want[id] = struct{}{}
	}
	ids := make([]uint64, 0, len(want))
	for id := range want {
		ids = append(ids, id)
	}
	found, err := mysql.CountOrders(ctx, db, ids)
	if err != nil {
		return 0, err
	}
	return int64(len(want)) - found, nil
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}
