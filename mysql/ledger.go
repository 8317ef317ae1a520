package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/flashgate/flashgate"
)

// liveStatuses is the SQL list of the statuses that hold units in MySQL.
var liveStatuses = "'" + string(flashgate.OrderConfirmed) + "','" + string(flashgate.OrderPaid) + "'"

// Ledger is MySQL's side of a sale's ledger, as the audit reads it: each
// counter, and what the live orders (confirmed and paid) add up to, so that
// every counter can be checked against the orders it counts.
type Ledger struct {
	Total, Sold, PerUserLimit int64
	// Limits is nil for a sale without purchase limits.
	Limits []flashgate.Limit
	// ByStatus counts orders and units per status.
	ByStatus map[string]StatusCount
	// Regions holds each region's counters and live units (absent for a sale
	// without regions; a region live orders name that the sale lacks has a
	// zero total).
	Regions map[string]*RegionLedger
	// Buyers holds each buyer's live units, user_purchases.units and, in
	// Kept, the units of the orders the buyer canceled: their quota is not
	// given back (mysql.ReturnUnits), so user_purchases counts them too.
	Buyers map[string]*Counted
	// Usage holds, per purchase-limit counter, what live orders charge it and
	// limit_usage.used.
	Usage map[UsageKey]*Counted
}

// RegionLedger is one region's counters and live units.
type RegionLedger struct{ Total, Sold, Live int64 }

// Counted is a counter's value and what the live orders say it should be
// (with Kept: a buyer's, the units of orders they canceled).
type Counted struct{ Live, Kept, Counted int64 }

// SaleLedger reads the sale's ledger (no locks: exact once the system has
// drained). ErrSaleNotFound for a sale MySQL does not know.
func SaleLedger(ctx context.Context, db Querier, sale string) (*Ledger, error) {
	l := &Ledger{Regions: map[string]*RegionLedger{}, Buyers: map[string]*Counted{}}
	var limitsJSON sql.NullString
	err := db.QueryRowContext(ctx, `SELECT total, sold, per_user_limit, limits FROM sales WHERE id = ?`, sale).
		Scan(&l.Total, &l.Sold, &l.PerUserLimit, &limitsJSON)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrSaleNotFound
	}
	if err != nil {
		return nil, err
	}
	if l.ByStatus, err = OrdersByStatus(ctx, db, sale); err != nil {
		return nil, err
	}
	if err := l.readRegions(ctx, db, sale); err != nil {
		return nil, fmt.Errorf("regions: %w", err)
	}
	if err := l.readBuyers(ctx, db, sale); err != nil {
		return nil, fmt.Errorf("buyers: %w", err)
	}
	if limitsJSON.Valid && limitsJSON.String != "" {
		if err := json.Unmarshal([]byte(limitsJSON.String), &l.Limits); err != nil {
			return nil, fmt.Errorf("limits: %w", err)
		}
		if l.Limits == nil {
			l.Limits = []flashgate.Limit{}
		}
		if err := l.readUsage(ctx, db, sale); err != nil {
			return nil, fmt.Errorf("limits: %w", err)
		}
	}
	return l, nil
}

func (l *Ledger) readRegions(ctx context.Context, db Querier, sale string) error {
	rows, err := db.QueryContext(ctx, `SELECT region, total, sold FROM sale_regions WHERE sale_id = ?`, sale)
	if err != nil {
		return err
	}
	err = scanRows(rows, func() error {
		var name string
		g := &RegionLedger{}
		err := rows.Scan(&name, &g.Total, &g.Sold)
		l.Regions[name] = g
		return err
	})
	if err != nil || len(l.Regions) == 0 {
		return err
	}
	rows, err = db.QueryContext(ctx, `SELECT region, SUM(quantity) FROM orders
		WHERE sale_id = ? AND status IN (`+liveStatuses+`) GROUP BY region`, sale)
	if err != nil {
		return err
	}
	return scanRows(rows, func() error {
		var name string
		var live int64
		if err := rows.Scan(&name, &live); err != nil {
			return err
		}
		g := l.Regions[name]
		if g == nil {
			g = &RegionLedger{}
			l.Regions[name] = g
		}
		g.Live = live
		return nil
	})
}

func (l *Ledger) readBuyers(ctx context.Context, db Querier, sale string) error {
	rows, err := db.QueryContext(ctx, `SELECT user_id, SUM(quantity) FROM orders
		WHERE sale_id = ? AND status IN (`+liveStatuses+`) GROUP BY user_id`, sale)
	if err != nil {
		return err
	}
	err = scanRows(rows, func() error {
		var u string
		c := &Counted{}
		err := rows.Scan(&u, &c.Live)
		l.Buyers[u] = c
		return err
	})
	if err != nil {
		return err
	}
	rows, err = db.QueryContext(ctx, `SELECT user_id, SUM(quantity) FROM orders
		WHERE sale_id = ? AND status = ? AND reason = ? GROUP BY user_id`, sale, flashgate.OrderCanceled, flashgate.ReasonCanceled)
	if err != nil {
		return err
	}
	err = scanRows(rows, func() error {
		var u string
		var kept int64
		if err := rows.Scan(&u, &kept); err != nil {
			return err
		}
		if l.Buyers[u] == nil {
			l.Buyers[u] = &Counted{}
		}
		l.Buyers[u].Kept = kept
		return nil
	})
	if err != nil {
		return err
	}
	rows, err = db.QueryContext(ctx, `SELECT user_id, units FROM user_purchases WHERE sale_id = ?`, sale)
	if err != nil {
		return err
	}
	return scanRows(rows, func() error {
		var u string
		var units int64
		if err := rows.Scan(&u, &units); err != nil {
			return err
		}
		if l.Buyers[u] == nil {
			l.Buyers[u] = &Counted{}
		}
		l.Buyers[u].Counted = units
		return nil
	})
}

func (l *Ledger) readUsage(ctx context.Context, db Querier, sale string) error {
	l.Usage = map[UsageKey]*Counted{}
	at := func(k UsageKey) *Counted {
		if l.Usage[k] == nil {
			l.Usage[k] = &Counted{}
		}
		return l.Usage[k]
	}
	rows, err := db.QueryContext(ctx, `SELECT charges FROM orders
		WHERE sale_id = ? AND status IN (`+liveStatuses+`) AND charges <> ''`, sale)
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
			at(UsageKey{c.Limit, c.Window, c.Subject}).Live += c.Inc
		}
		return nil
	})
	if err != nil {
		return err
	}
	rows, err = db.QueryContext(ctx, `SELECT lim, window_id, subject, used FROM limit_usage WHERE sale_id = ?`, sale)
	if err != nil {
		return err
	}
	return scanRows(rows, func() error {
		var k UsageKey
		var used int64
		err := rows.Scan(&k.Lim, &k.Window, &k.Subject, &used)
		at(k).Counted = used
		return err
	})
}

// CountOrders counts how many of ids MySQL has a row of (ids distinct).
func CountOrders(ctx context.Context, db Querier, ids []uint64) (int64, error) {
	var found int64
	for len(ids) > 0 {
		n := min(len(ids), sqlChunk)
		args := make([]any, n)
		for i, id := range ids[:n] {
			args[i] = id
		}
		var c int64
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM orders WHERE id IN (`+placeholders(n)+`)`, args...).Scan(&c); err != nil {
			return 0, err
		}
		found += c
		ids = ids[n:]
	}
	return found, nil
}
