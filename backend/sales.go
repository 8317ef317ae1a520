package backend

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/flashgate/flashgate"
)

var (
	errSaleNotFound = errors.New("sale not found")
	errSaleExists   = errors.New("sale exists")
)

// MySQL error numbers the backend tells apart.
const (
	erDupEntry        = 1062
	erLockWaitTimeout = 1205
	erLockDeadlock    = 1213
)

func mysqlErrno(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// saleRow is a sale as MySQL holds it: the spec and its counters.
type saleRow struct {
	flashgate.Sale
	Sold       int64
	RegionSold map[string]int64
}

// Remaining is what Redis should hold when nothing is in flight: per region
// total − sold, or total − sold for a sale without regions ("" key).
func (s *saleRow) Remaining() map[string]int64 {
	if len(s.Regions) == 0 {
		return map[string]int64{"": s.Total - s.Sold}
	}
	out := make(map[string]int64, len(s.Regions))
	for r, total := range s.Regions {
		out[r] = total - s.RegionSold[r]
	}
	return out
}

// insertSale writes a new sale and its regions in one transaction.
func insertSale(ctx context.Context, db *sql.DB, s *flashgate.Sale, now time.Time) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var limits any
	if len(s.Limits) > 0 {
		b, err := json.Marshal(s.Limits)
		if err != nil {
			return fmt.Errorf("sale %s limits: %w", s.ID, err)
		}
		limits = string(b)
	}
	tz := s.TimeZone
	if tz == "" {
		tz = "UTC"
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO sales (id, title, price_cents, total, sold, starts_at, ends_at,
		per_user_limit, per_order_max, limits, time_zone, closed, created_at, updated_at)
		VALUES (?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		s.ID, s.Title, s.PriceCents, s.Total, s.StartsAt, s.EndsAt, s.PerUserLimit, s.PerOrderMax, limits, tz, s.Closed, now, now)
	if mysqlErrno(err) == erDupEntry {
		return fmt.Errorf("sale %s: %w", s.ID, errSaleExists)
	}
	if err != nil {
		return fmt.Errorf("insert sale %s: %w", s.ID, err)
	}
	for _, r := range s.RegionNames() {
		if _, err := tx.ExecContext(ctx, `INSERT INTO sale_regions (sale_id, region, total, sold) VALUES (?, ?, ?, 0)`,
			s.ID, r, s.Regions[r]); err != nil {
			return fmt.Errorf("insert sale %s region %s: %w", s.ID, r, err)
		}
	}
	return tx.Commit()
}

// queryer is what sale reads need: a *sql.DB or a *sql.Tx.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// loadSale reads a sale, its regions and its counters (no locks).
func loadSale(ctx context.Context, q queryer, id string) (*saleRow, error) {
	s := &saleRow{}
	var limits sql.NullString
	err := q.QueryRowContext(ctx, `SELECT id, title, price_cents, total, sold, starts_at, ends_at,
		per_user_limit, per_order_max, limits, time_zone, closed FROM sales WHERE id = ?`, id).
		Scan(&s.ID, &s.Title, &s.PriceCents, &s.Total, &s.Sold, &s.StartsAt, &s.EndsAt,
			&s.PerUserLimit, &s.PerOrderMax, &limits, &s.TimeZone, &s.Closed)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("sale %s: %w", id, errSaleNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("load sale %s: %w", id, err)
	}
	if limits.Valid && limits.String != "" {
		if err := json.Unmarshal([]byte(limits.String), &s.Limits); err != nil {
			return nil, fmt.Errorf("load sale %s limits: %w", id, err)
		}
	}
	rows, err := q.QueryContext(ctx, `SELECT region, total, sold FROM sale_regions WHERE sale_id = ?`, id)
	if err != nil {
		return nil, fmt.Errorf("load sale %s regions: %w", id, err)
	}
	defer rows.Close()
	for rows.Next() {
		var r string
		var total, sold int64
		if err := rows.Scan(&r, &total, &sold); err != nil {
			return nil, fmt.Errorf("load sale %s regions: %w", id, err)
		}
		if s.Regions == nil {
			s.Regions, s.RegionSold = map[string]int64{}, map[string]int64{}
		}
		s.Regions[r], s.RegionSold[r] = total, sold
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load sale %s regions: %w", id, err)
	}
	return s, nil
}

// closeSaleRow marks a sale closed: from now on the guard refuses its orders.
func closeSaleRow(ctx context.Context, db *sql.DB, id string, now time.Time) error {
	// closed_at keeps the first close: retention counts from it.
	res, err := db.ExecContext(ctx, `UPDATE sales SET closed = 1, closed_at = COALESCE(closed_at, ?), updated_at = ? WHERE id = ?`, now, now, id)
	if err != nil {
		return fmt.Errorf("close sale %s: %w", id, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		// Zero rows changed: no such sale, or closed already.
		var one int
		err := db.QueryRowContext(ctx, `SELECT 1 FROM sales WHERE id = ?`, id).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("sale %s: %w", id, errSaleNotFound)
		}
		if err != nil {
			return fmt.Errorf("close sale %s: %w", id, err)
		}
	}
	return nil
}

// openSaleIDs lists the sales still selling or about to: not closed, not ended.
func openSaleIDs(ctx context.Context, db *sql.DB, now time.Time) ([]string, error) {
	rows, err := db.QueryContext(ctx, `SELECT id FROM sales WHERE closed = 0 AND ends_at > ? ORDER BY starts_at`, now)
	if err != nil {
		return nil, fmt.Errorf("open sales: %w", err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("open sales: %w", err)
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// statusCount is the orders and units of one status.
type statusCount struct {
	Orders int64 `json:"orders"`
	Units  int64 `json:"units"`
}

func ordersByStatus(ctx context.Context, db *sql.DB, id string) (map[string]statusCount, error) {
	rows, err := db.QueryContext(ctx, `SELECT status, COUNT(*), COALESCE(SUM(quantity), 0) FROM orders
		WHERE sale_id = ? GROUP BY status`, id)
	if err != nil {
		return nil, fmt.Errorf("orders of %s: %w", id, err)
	}
	defer rows.Close()
	out := map[string]statusCount{}
	for rows.Next() {
		var st string
		var c statusCount
		if err := rows.Scan(&st, &c.Orders, &c.Units); err != nil {
			return nil, fmt.Errorf("orders of %s: %w", id, err)
		}
		out[st] = c
	}
	return out, rows.Err()
}
