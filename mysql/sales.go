package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/flashgate/flashgate"
)

var (
	// ErrSaleNotFound is a sale MySQL does not know.
	ErrSaleNotFound = errors.New("sale not found")
	// ErrSaleExists is a sale created twice.
	ErrSaleExists = errors.New("sale exists")
)

// SaleRow is a sale as MySQL holds it: the spec and its counters.
type SaleRow struct {
	flashgate.Sale
	Sold       int64
	RegionSold map[string]int64
	// Stale counts the orders the degraded lane wrote since Redis last
	// matched MySQL (docs/degrade.md); 0 when it does.
	Stale int64
	// Epoch is the epoch of the sale's books in Redis: raised by every
	// rebuild (BumpEpoch), carried by every write-back (docs/recovery.md).
	Epoch int64
	// LimitsText is the limits column as MySQL holds it ("" for none): what
	// a writer that cached the limits hands back to GuardSoldAt, so that its
	// batch guard holds only while the row still has the limits it read.
	LimitsText string
}

// Remaining is what Redis should hold when nothing is in flight: per region
// total − sold, or total − sold for a sale without regions ("" key).
func (s *SaleRow) Remaining() map[string]int64 {
	if len(s.Regions) == 0 {
		return map[string]int64{"": s.Total - s.Sold}
	}
	out := make(map[string]int64, len(s.Regions))
	for r, total := range s.Regions {
		out[r] = total - s.RegionSold[r]
	}
	return out
}

// InsertSale writes a new sale and its regions in one transaction.
func InsertSale(ctx context.Context, db *sql.DB, s *flashgate.Sale, now time.Time) error {
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
	var tags any
	if len(s.BucketTags) > 0 {
		tags = strings.Join(s.BucketTags, ",")
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO sales (id, title, price_cents, total, sold, starts_at, ends_at,
		per_user_limit, per_order_max, limits, time_zone, closed, bucket_tags, created_at, updated_at, degrade, degrade_rate)
		VALUES (?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		s.ID, s.Title, s.PriceCents, s.Total, s.StartsAt, s.EndsAt, s.PerUserLimit, s.PerOrderMax, limits, tz, s.Closed, tags, now, now,
		s.DegradeMode(), s.DegradeRate)
	if Errno(err) == ErDupEntry {
		return fmt.Errorf("sale %s: %w", s.ID, ErrSaleExists)
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

// LoadSale reads a sale, its regions and its counters (no locks).
func LoadSale(ctx context.Context, q Querier, id string) (*SaleRow, error) {
	return loadSale(ctx, q, id, "")
}

// loadSale reads the sale; lock is "" or " FOR UPDATE" (the sale row lock).
func loadSale(ctx context.Context, q Querier, id, lock string) (*SaleRow, error) {
	s := &SaleRow{}
	var limits, tags sql.NullString
	err := q.QueryRowContext(ctx, `SELECT id, title, price_cents, total, sold, starts_at, ends_at,
		per_user_limit, per_order_max, limits, time_zone, closed, paused, degrade, degrade_rate, stale, bucket_tags, epoch FROM sales WHERE id = ?`+lock, id).
		Scan(&s.ID, &s.Title, &s.PriceCents, &s.Total, &s.Sold, &s.StartsAt, &s.EndsAt,
			&s.PerUserLimit, &s.PerOrderMax, &limits, &s.TimeZone, &s.Closed, &s.Paused, &s.Degrade, &s.DegradeRate, &s.Stale, &tags, &s.Epoch)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("sale %s: %w", id, ErrSaleNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("load sale %s: %w", id, err)
	}
	if s.Degrade == flashgate.DegradeClosed {
		s.Degrade = "" // the spec's default, as the admin API takes it
	}
	if limits.Valid && limits.String != "" {
		s.LimitsText = limits.String
		if err := json.Unmarshal([]byte(limits.String), &s.Limits); err != nil {
			return nil, fmt.Errorf("load sale %s limits: %w", id, err)
		}
	}
	if tags.Valid && tags.String != "" {
		s.BucketTags = strings.Split(tags.String, ",")
		s.Buckets = len(s.BucketTags)
	}
	rows, err := q.QueryContext(ctx, `SELECT region, total, sold FROM sale_regions WHERE sale_id = ?`, id)
	if err != nil {
		return nil, fmt.Errorf("load sale %s regions: %w", id, err)
	}
	err = scanRows(rows, func() error {
		var r string
		var total, sold int64
		if err := rows.Scan(&r, &total, &sold); err != nil {
			return err
		}
		if s.Regions == nil {
			s.Regions, s.RegionSold = map[string]int64{}, map[string]int64{}
		}
		s.Regions[r], s.RegionSold[r] = total, sold
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load sale %s regions: %w", id, err)
	}
	return s, nil
}

// CloseSale marks a sale closed: from now on the guard refuses its orders.
func CloseSale(ctx context.Context, db Querier, id string, now time.Time) error {
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
			return fmt.Errorf("sale %s: %w", id, ErrSaleNotFound)
		}
		if err != nil {
			return fmt.Errorf("close sale %s: %w", id, err)
		}
	}
	return nil
}

// LockSale takes the sale row lock, which serialises every change to the
// sale's counters across backends; false when MySQL has no such sale.
func LockSale(ctx context.Context, tx Querier, id string) (bool, error) {
	_, found, err := LockSaleEpoch(ctx, tx, id)
	return found, err
}

// LockSaleEpoch is LockSale that also reads the epoch of the sale's books in
// Redis: the epoch a write-back of what the transaction decides carries. Read
// under the lock, it is older than every rebuild that can miss the decision
// (a rebuild raises it under the same lock, after the commit).
func LockSaleEpoch(ctx context.Context, tx Querier, id string) (epoch int64, found bool, err error) {
	err = tx.QueryRowContext(ctx, `SELECT epoch FROM sales WHERE id = ? FOR UPDATE`, id).Scan(&epoch)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return epoch, err == nil, err
}

// SaleEpoch reads the epoch of the sale's books in Redis without a lock: the
// epoch of a write-back whose decision was committed before this read (0 for
// a sale MySQL does not have).
func SaleEpoch(ctx context.Context, q Querier, id string) (int64, error) {
	var epoch int64
	err := q.QueryRowContext(ctx, `SELECT epoch FROM sales WHERE id = ?`, id).Scan(&epoch)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("epoch of %s: %w", id, err)
	}
	return epoch, nil
}

// BumpEpoch raises the sale's epoch and answers the new one. The caller holds
// the sale row lock (LockSale) and rebuilds Redis before it commits.
func BumpEpoch(ctx context.Context, tx Querier, id string) (int64, error) {
	// rebuilt_at is MySQL's time of the rebuild (migration 0013): an order
	// Redis has no trace of is written only when its id is older.
	if _, err := tx.ExecContext(ctx, `UPDATE sales SET epoch = epoch + 1, rebuilt_at = UTC_TIMESTAMP(3) WHERE id = ?`, id); err != nil {
		return 0, fmt.Errorf("epoch of %s: %w", id, err)
	}
	var epoch int64
	if err := tx.QueryRowContext(ctx, `SELECT epoch FROM sales WHERE id = ?`, id).Scan(&epoch); err != nil {
		return 0, fmt.Errorf("epoch of %s: %w", id, err)
	}
	return epoch, nil
}

// LockSaleLimit takes the sale row lock and reads what the order-by-order
// guards need: the per-user limit and, for a closed sale, when it closed
// (closedAt is the zero time for an open sale; for a sale closed before
// closed_at existed, the Unix epoch: it closed before any order we hold).
func LockSaleLimit(ctx context.Context, tx Querier, id string) (limit int64, closedAt time.Time, found bool, err error) {
	var closed bool
	var at sql.NullTime
	err = tx.QueryRowContext(ctx, `SELECT per_user_limit, closed, closed_at FROM sales WHERE id = ? FOR UPDATE`, id).Scan(&limit, &closed, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, time.Time{}, false, nil
	}
	switch {
	case err != nil || !closed:
	case at.Valid:
		closedAt = at.Time
	default:
		closedAt = time.Unix(0, 0)
	}
	return limit, closedAt, err == nil, err
}

// SaleLimits is what LockSaleLimits reads under the sale row lock.
type SaleLimits struct {
	// PerUser is per_user_limit; Text the limits column ("" for none), as
	// SaleRow.LimitsText has it.
	PerUser int64
	Text    string
	// ClosedAt is when a closed sale closed (as LockSaleLimit).
	ClosedAt time.Time
	// RebuiltAt is when the sale's books in Redis were last rebuilt
	// (BumpEpoch), on MySQL's clock; zero when never since migration 0013.
	RebuiltAt time.Time
	// Epoch is the epoch of the sale's books in Redis (sales.epoch).
	Epoch int64
}

// LockSaleLimits takes the sale row lock and reads the limits every guard
// of the sale must use now (a PATCH changes them under the same lock), and
// when a closed sale closed; false when MySQL has no such sale.
func LockSaleLimits(ctx context.Context, tx Querier, id string) (SaleLimits, bool, error) {
	var l SaleLimits
	var closed bool
	var at, rebuilt sql.NullTime
	err := tx.QueryRowContext(ctx, `SELECT per_user_limit, COALESCE(limits, ''), closed, closed_at, rebuilt_at, epoch FROM sales
		WHERE id = ? FOR UPDATE`, id).Scan(&l.PerUser, &l.Text, &closed, &at, &rebuilt, &l.Epoch)
	if errors.Is(err, sql.ErrNoRows) {
		return SaleLimits{}, false, nil
	}
	if err != nil {
		return SaleLimits{}, false, err
	}
	if rebuilt.Valid {
		l.RebuiltAt = rebuilt.Time
	}
	switch {
	case !closed:
	case at.Valid:
		l.ClosedAt = at.Time
	default:
		l.ClosedAt = time.Unix(0, 0)
	}
	return l, true, nil
}

// OpenSaleIDs lists the sales still selling or about to: not closed, not ended.
func OpenSaleIDs(ctx context.Context, db Querier, now time.Time) ([]string, error) {
	ids, err := saleIDs(ctx, db, `SELECT id FROM sales WHERE closed = 0 AND ends_at > ? ORDER BY starts_at`, now)
	if err != nil {
		return nil, fmt.Errorf("open sales: %w", err)
	}
	return ids, nil
}

// RecentSaleIDs lists the sales that end after since (closed ones too).
func RecentSaleIDs(ctx context.Context, db Querier, since time.Time) ([]string, error) {
	return saleIDs(ctx, db, `SELECT id FROM sales WHERE ends_at > ? ORDER BY starts_at`, since)
}

func saleIDs(ctx context.Context, db Querier, query string, at time.Time) ([]string, error) {
	rows, err := db.QueryContext(ctx, query, at)
	if err != nil {
		return nil, err
	}
	var ids []string
	err = scanRows(rows, func() error {
		var id string
		err := rows.Scan(&id)
		ids = append(ids, id)
		return err
	})
	return ids, err
}

// StatusCount is the orders and units of one status.
type StatusCount struct {
	Orders int64 `json:"orders"`
	Units  int64 `json:"units"`
}

// OrdersByStatus counts a sale's orders and units per status.
func OrdersByStatus(ctx context.Context, db Querier, id string) (map[string]StatusCount, error) {
	rows, err := db.QueryContext(ctx, `SELECT status, COUNT(*), COALESCE(SUM(quantity), 0) FROM orders
		WHERE sale_id = ? GROUP BY status`, id)
	if err != nil {
		return nil, fmt.Errorf("orders of %s: %w", id, err)
	}
	out := map[string]StatusCount{}
	err = scanRows(rows, func() error {
		var st string
		var c StatusCount
		err := rows.Scan(&st, &c.Orders, &c.Units)
		out[st] = c
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("orders of %s: %w", id, err)
	}
	return out, nil
}

// RetireCandidates pages through the sales not yet retired whose end
// (ends_at, or closed_at when it closed earlier) is at or before cutoff, in
// (ends_at, id) order after (after, afterID), page at a time. A sale closed
// before closed_at existed counts from its last update.
func RetireCandidates(ctx context.Context, db Querier, cutoff, after time.Time, afterID string, page int) (ids []string, last time.Time, lastID string, err error) {
	rows, err := db.QueryContext(ctx, `SELECT id, ends_at FROM sales
		WHERE retired_at IS NULL
		  AND (ends_at <= ? OR closed_at <= ? OR (closed = 1 AND closed_at IS NULL AND updated_at <= ?))
		  AND (ends_at > ? OR (ends_at = ? AND id > ?))
		ORDER BY ends_at, id LIMIT ?`, cutoff, cutoff, cutoff, after, after, afterID, page)
	if err != nil {
		return nil, last, "", fmt.Errorf("retention: candidates: %w", err)
	}
	err = scanRows(rows, func() error {
		err := rows.Scan(&lastID, &last)
		ids = append(ids, lastID)
		return err
	})
	if err != nil {
		return nil, last, "", fmt.Errorf("retention: candidates: %w", err)
	}
	return ids, last, lastID, nil
}

// UnpaidOrders counts the sale's orders not final yet: confirmed (unpaid,
// even past the deadline: the sweeper will cancel them) or pending.
func UnpaidOrders(ctx context.Context, db Querier, id string) (int64, error) {
	var open int64
	err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM orders WHERE sale_id = ? AND status IN (?, ?)`,
		id, string(flashgate.OrderConfirmed), string(flashgate.OrderPending)).Scan(&open)
	return open, err
}

// MarkRetired records that the sale left Redis for good (the first time only).
func MarkRetired(ctx context.Context, db Querier, id string, now time.Time) error {
	_, err := db.ExecContext(ctx, `UPDATE sales SET retired_at = ? WHERE id = ? AND retired_at IS NULL`, now.UTC(), id)
	return err
}

// SaleRetired reports when the sale left Redis for good (nil: it has not).
func SaleRetired(ctx context.Context, q Querier, id string) (*time.Time, error) {
	var at sql.NullTime
	err := q.QueryRowContext(ctx, `SELECT retired_at FROM sales WHERE id = ?`, id).Scan(&at)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("sale %s: %w", id, ErrSaleNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("sale %s: %w", id, err)
	}
	if !at.Valid {
		return nil, nil
	}
	t := at.Time.UTC()
	return &t, nil
}

// HasOrders reports whether MySQL holds any order of the sale.
func HasOrders(ctx context.Context, db Querier, sale string) (bool, error) {
	var found bool
	err := db.QueryRowContext(ctx, `SELECT EXISTS(SELECT 1 FROM orders WHERE sale_id = ?)`, sale).Scan(&found)
	return found, err
}

// Probe reads a row of each table a sale's orders touch: an error means MySQL
// (or one of its tables) cannot take the sale's writes now.
func Probe(ctx context.Context, db Querier, sale string) error {
	var n int64
	return db.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM orders WHERE id = 0)
		+ (SELECT COUNT(*) FROM sales WHERE id = ?) + (SELECT COUNT(*) FROM sale_regions WHERE sale_id = ? AND region = '')
		+ (SELECT COUNT(*) FROM user_purchases WHERE sale_id = ? AND user_id = '')`, sale, sale, sale).Scan(&n)
}

// SaleOrderCount counts the sale's order rows, whatever their status.
func SaleOrderCount(ctx context.Context, db Querier, sale string) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM orders WHERE sale_id = ?`, sale).Scan(&n)
	return n, err
}

// SaleSold reads the sale's sold counter.
func SaleSold(ctx context.Context, db Querier, sale string) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, `SELECT sold FROM sales WHERE id = ?`, sale).Scan(&n)
	return n, err
}

// CreateDatabase creates a database of its own for a bench run (db is a
// connection to the server, no database selected).
func CreateDatabase(ctx context.Context, db Querier, name string) error {
	_, err := db.ExecContext(ctx, "CREATE DATABASE `"+name+"`")
	return err
}

// DropDatabase drops a bench run's database.
func DropDatabase(ctx context.Context, db Querier, name string) error {
	_, err := db.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`")
	return err
}

// MostUsed is the most one subject has used of a sale's purchase limit (by
// index) in a window, in MySQL.
func MostUsed(ctx context.Context, q Querier, sale string, limit int, window string) (int64, error) {
	var n int64
	err := q.QueryRowContext(ctx, `SELECT COALESCE(MAX(used), 0) FROM limit_usage WHERE sale_id = ? AND lim = ? AND window_id = ?`,
		sale, limit, window).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("usage of %s limit %d: %w", sale, limit, err)
	}
	return n, nil
}

// UpdateSale writes a sale's window and limits and its total, under the row
// lock the caller's transaction took (LockSale): the caller has checked that
// the change invalidates no count already taken.
func UpdateSale(ctx context.Context, tx Querier, s *flashgate.Sale, now time.Time) error {
	var limits any
	if len(s.Limits) > 0 {
		b, err := json.Marshal(s.Limits)
		if err != nil {
			return fmt.Errorf("update sale %s: %w", s.ID, err)
		}
		limits = string(b)
	}
	_, err := tx.ExecContext(ctx, `UPDATE sales SET total = ?, starts_at = ?, ends_at = ?, per_user_limit = ?,
		per_order_max = ?, limits = ?, updated_at = ? WHERE id = ?`,
		s.Total, s.StartsAt.UTC(), s.EndsAt.UTC(), s.PerUserLimit, s.PerOrderMax, limits, now.UTC(), s.ID)
	if err != nil {
		return fmt.Errorf("update sale %s: %w", s.ID, err)
	}
	return nil
}

// UpdateSaleRegions sets each region's total of s (its regions exist: a
// live sale's regions change their units, never their names).
func UpdateSaleRegions(ctx context.Context, tx Querier, s *flashgate.Sale) error {
	for _, r := range s.RegionNames() {
		res, err := tx.ExecContext(ctx, `UPDATE sale_regions SET total = ? WHERE sale_id = ? AND region = ?`, s.Regions[r], s.ID, r)
		if err != nil {
			return fmt.Errorf("update sale %s region %s: %w", s.ID, r, err)
		}
		if n, err := res.RowsAffected(); err == nil && n == 0 {
			// 0 rows: no such row, or the total is the same (MySQL counts changed rows).
			var one int
			if err := tx.QueryRowContext(ctx, `SELECT 1 FROM sale_regions WHERE sale_id = ? AND region = ?`, s.ID, r).Scan(&one); err != nil {
				return fmt.Errorf("update sale %s region %s: %w", s.ID, r, err)
			}
		}
	}
	return nil
}

// MostUnitsOneBuyer is the most units one buyer of the sale holds in MySQL.
func MostUnitsOneBuyer(ctx context.Context, q Querier, sale string) (int64, error) {
	var n int64
	err := q.QueryRowContext(ctx, `SELECT COALESCE(MAX(units), 0) FROM user_purchases WHERE sale_id = ?`, sale).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("buyers of %s: %w", sale, err)
	}
	return n, nil
}

// SaleIDs lists the ids of the newest sales by start, at most limit of them.
func SaleIDs(ctx context.Context, q Querier, limit int) ([]string, error) {
	rows, err := q.QueryContext(ctx, `SELECT id FROM sales ORDER BY starts_at DESC, id LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("list sales: %w", err)
	}
	var ids []string
	err = scanRows(rows, func() error {
		var id string
		if err := rows.Scan(&id); err != nil {
			return err
		}
		ids = append(ids, id)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list sales: %w", err)
	}
	return ids, nil
}
