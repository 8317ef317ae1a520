// Package audit proves DESIGN.md §2 for one sale from the outside: it reads MySQL
// (the source of truth) and Redis and reports every unit oversold, every buyer over
// the limit, every accepted order without a row, every unit counted twice, and
// whether Redis remaining + reserved + MySQL sold equals the sale's total. It writes
// nothing. `flashgate bench`, the demo and the tests call Check after the system
// has drained; the backend's admin ledger reuses Ledger for its invariant part.
package audit

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/lua"
)

// OpenDB opens MySQL the way every flashgate process does: times are parsed into
// time.Time in UTC, and parameters are interpolated client-side (one round trip
// per statement instead of prepare + execute + close).
func OpenDB(dsn string) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("mysql dsn: %w", err)
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	cfg.InterpolateParams = true
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("mysql %s: %w", cfg.Addr, err)
	}
	return sql.OpenDB(conn), nil
}

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

// OK reports whether the sale keeps every invariant of DESIGN.md §2.
func (r Report) OK() bool {
	return r.Oversold == 0 && r.OverLimitUsers == 0 && r.OverLimitSubjects == 0 && r.Lost == 0 && r.Duplicated == 0 && r.LedgerHolds
}

// String is a one-line summary for logs and the CLI.
func (r Report) String() string {
	return fmt.Sprintf("sale %s: total=%d sold=%d live=%d orders=%d %v oversold=%d over_limit_users=%d over_limit_subjects=%d lost=%d duplicated=%d redis_remaining=%d redis_reserved=%d ledger_diff=%d buyers=%d ok=%t",
		r.SaleID, r.Total, r.Sold, r.LiveUnits, r.Orders, r.ByStatus, r.Oversold, r.OverLimitUsers, r.OverLimitSubjects, r.Lost,
		r.Duplicated, r.RedisRemaining, r.RedisReserved, r.LedgerDiff, r.DistinctBuyers, r.OK())
}

// liveStatuses is the SQL list of the statuses that hold units in MySQL.
var liveStatuses = "'" + string(flashgate.OrderConfirmed) + "','" + string(flashgate.OrderPaid) + "'"

// Check audits saleID. accepted lists the order ids the gateway answered 202
// for (nil when the caller does not know them: Lost is then 0). It is exact
// once the system has drained; during traffic the Redis and MySQL reads are
// different moments.
func Check(ctx context.Context, db *sql.DB, rc rueidis.Client, saleID string, accepted []uint64) (Report, error) {
	r := Report{SaleID: saleID, ByStatus: map[string]int64{}}
	var limit int64
	var limitsJSON sql.NullString
	err := db.QueryRowContext(ctx, `SELECT total, sold, per_user_limit, limits FROM sales WHERE id = ?`, saleID).
		Scan(&r.Total, &r.Sold, &limit, &limitsJSON)
	if errors.Is(err, sql.ErrNoRows) {
		return r, fmt.Errorf("audit %s: %w", saleID, ErrSaleNotFound)
	}
	if err != nil {
		return r, fmt.Errorf("audit %s: %w", saleID, err)
	}
	fail := func(what string, err error) (Report, error) {
		return r, fmt.Errorf("audit %s: %s: %w", saleID, what, err)
	}

	// Orders by status.
	rows, err := db.QueryContext(ctx, `SELECT status, COUNT(*), COALESCE(SUM(quantity), 0) FROM orders
		WHERE sale_id = ? GROUP BY status`, saleID)
	if err != nil {
		return fail("orders", err)
	}
	err = scanRows(rows, func() error {
		var st string
		var n, units int64
		if err := rows.Scan(&st, &n, &units); err != nil {
			return err
		}
		r.ByStatus[st], r.Orders = n, r.Orders+n
		if flashgate.OrderStatus(st) == flashgate.OrderConfirmed || flashgate.OrderStatus(st) == flashgate.OrderPaid {
			r.LiveUnits += units
		}
		return nil
	})
	if err != nil {
		return fail("orders", err)
	}
	r.Oversold = max(0, r.LiveUnits-r.Total)
	r.Duplicated = abs(r.Sold - r.LiveUnits)

	// Regions: live units against the region's total and its sold counter.
	type region struct{ total, sold, live int64 }
	regions := map[string]*region{}
	rows, err = db.QueryContext(ctx, `SELECT region, total, sold FROM sale_regions WHERE sale_id = ?`, saleID)
	if err != nil {
		return fail("regions", err)
	}
	err = scanRows(rows, func() error {
		var name string
		g := &region{}
		if err := rows.Scan(&name, &g.total, &g.sold); err != nil {
			return err
		}
		regions[name] = g
		return nil
	})
	if err != nil {
		return fail("regions", err)
	}
	if len(regions) > 0 {
		rows, err = db.QueryContext(ctx, `SELECT region, SUM(quantity) FROM orders
			WHERE sale_id = ? AND status IN (`+liveStatuses+`) GROUP BY region`, saleID)
		if err != nil {
			return fail("regions", err)
		}
		err = scanRows(rows, func() error {
			var name string
			var live int64
			if err := rows.Scan(&name, &live); err != nil {
				return err
			}
			g := regions[name]
			if g == nil {
				// Live units in a region the sale does not have: all of them are too many.
				g = &region{}
				regions[name] = g
			}
			g.live = live
			return nil
		})
		if err != nil {
			return fail("regions", err)
		}
		for _, g := range regions {
			r.Oversold += max(0, g.live-g.total)
			r.Duplicated += abs(g.sold - g.live)
		}
	}

	// Users: live units against the limit and against user_purchases.
	users := map[string][2]int64{} // live, counted
	rows, err = db.QueryContext(ctx, `SELECT user_id, SUM(quantity) FROM orders
		WHERE sale_id = ? AND status IN (`+liveStatuses+`) GROUP BY user_id`, saleID)
	if err != nil {
		return fail("buyers", err)
	}
	err = scanRows(rows, func() error {
		var u string
		var live int64
		if err := rows.Scan(&u, &live); err != nil {
			return err
		}
		users[u] = [2]int64{live, 0}
		return nil
	})
	if err != nil {
		return fail("buyers", err)
	}
	rows, err = db.QueryContext(ctx, `SELECT user_id, units FROM user_purchases WHERE sale_id = ?`, saleID)
	if err != nil {
		return fail("user_purchases", err)
	}
	err = scanRows(rows, func() error {
		var u string
		var units int64
		if err := rows.Scan(&u, &units); err != nil {
			return err
		}
		v := users[u]
		v[1] = units
		users[u] = v
		return nil
	})
	if err != nil {
		return fail("user_purchases", err)
	}
	for _, v := range users {
		if v[0] > 0 {
			r.DistinctBuyers++
		}
		if v[0] > limit {
			r.OverLimitUsers++
		}
		r.Duplicated += abs(v[1] - v[0])
	}

	if limitsJSON.Valid && limitsJSON.String != "" {
		var limits []flashgate.Limit
		if err := json.Unmarshal([]byte(limitsJSON.String), &limits); err != nil {
			return fail("limits", err)
		}
		if err := checkLimits(ctx, db, saleID, limits, &r); err != nil {
			return fail("limits", err)
		}
	}

	// Accepted orders without a row.
	if r.Lost, err = lost(ctx, db, accepted); err != nil {
		return fail("accepted", err)
	}

	names := make([]string, 0, len(regions))
	for name := range regions {
		names = append(names, name)
	}
	l, err := RedisLedger(ctx, rc, saleID, names)
	if err != nil {
		return fail("redis", err)
	}
	r.RedisRemaining, r.RedisReserved = l.Remaining, l.Reserved
	r.LedgerDiff = r.RedisRemaining + r.RedisReserved + r.Sold - r.Total
	r.LedgerHolds = r.LedgerDiff == 0
	return r, nil
}

// checkLimits adds up what the live orders charge each purchase-limit counter
// and compares it with the limit (OverLimitSubjects) and with limit_usage
// (Duplicated).
func checkLimits(ctx context.Context, db *sql.DB, saleID string, limits []flashgate.Limit, r *Report) error {
	type key struct {
		lim             int
		window, subject string
	}
	live := map[key]int64{}
	rows, err := db.QueryContext(ctx, `SELECT charges FROM orders
		WHERE sale_id = ? AND status IN (`+liveStatuses+`) AND charges <> ''`, saleID)
	if err != nil {
		return err
	}
	err = scanRows(rows, func() error {
		var enc string
		if err := rows.Scan(&enc); err != nil {
			return err
		}
		cs, err := flashgate.ParseCharges(enc)
		if err != nil {
			return err
		}
		for _, c := range cs {
			live[key{c.Limit, c.Window, c.Subject}] += c.Inc
		}
		return nil
	})
	if err != nil {
		return err
	}
	counted := map[key]int64{}
	rows, err = db.QueryContext(ctx, `SELECT lim, window_id, subject, used FROM limit_usage WHERE sale_id = ?`, saleID)
	if err != nil {
		return err
	}
	err = scanRows(rows, func() error {
		var k key
		var used int64
		if err := rows.Scan(&k.lim, &k.window, &k.subject, &used); err != nil {
			return err
		}
		counted[k] = used
		return nil
	})
	if err != nil {
		return err
	}
	for k, n := range live {
		if k.lim >= len(limits) || n > limits[k.lim].Max {
			r.OverLimitSubjects++
		}
		r.Duplicated += abs(counted[k] - n)
	}
	for k, n := range counted {
		if _, ok := live[k]; !ok {
			r.Duplicated += abs(n)
		}
	}
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
	k := lua.KeysFor(saleID, regions)
	var l Redis
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

// lostChunk bounds the ids of one IN list.
const lostChunk = 1000

func lost(ctx context.Context, db *sql.DB, accepted []uint64) (int64, error) {
	want := make(map[uint64]struct{}, len(accepted))
	for _, id := range accepted {
		want[id] = struct{}{}
	}
	ids := make([]any, 0, len(want))
	for id := range want {
		ids = append(ids, id)
	}
	var found int64
	for len(ids) > 0 {
		n := min(len(ids), lostChunk)
		var c int64
		err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM orders WHERE id IN (`+placeholders(n)+`)`, ids[:n]...).Scan(&c)
		if err != nil {
			return 0, err
		}
		found += c
		ids = ids[n:]
	}
	return int64(len(want)) - found, nil
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?,", n), ",")
}

func scanRows(rows *sql.Rows, each func() error) error {
	defer rows.Close()
	for rows.Next() {
		if err := each(); err != nil {
			return err
		}
	}
	return rows.Err()
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}
