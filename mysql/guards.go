package mysql

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/flashgate/flashgate"
)

// The guards: every unit sold is counted in sales.sold (and sale_regions.sold,
// user_purchases.units, limit_usage.used) by the transaction that inserts its
// order, under UPDATE … WHERE counter + n <= bound. A guard answers false
// when it refused (no row changed); the caller then rolls back (a batch) or
// to the order's savepoint (one order).

// GuardSold adds n units to the sale's sold count if they fit its total.
// open also requires the sale not to be closed (the batch guard, which runs
// before anything read the sale under lock). It takes the sale row lock,
// which serialises every batch of the sale across backends.
func GuardSold(ctx context.Context, tx Querier, sale string, n int64, now time.Time, open bool) (bool, error) {
	if open {
		return changed(tx.ExecContext(ctx, `UPDATE sales SET sold = sold + ?, updated_at = ?
			WHERE id = ? AND closed = 0 AND sold + ? <= total`, n, now, sale, n))
	}
	return changed(tx.ExecContext(ctx, `UPDATE sales SET sold = sold + ?, updated_at = ?
		WHERE id = ? AND sold + ? <= total`, n, now, sale, n))
}

// GuardSoldAt is GuardSold of an open sale (the batch guard) that also
// requires the sale row to hold the limits the caller's guards will use:
// perUser and limitsText as the caller read them (SaleRow.PerUserLimit and
// LimitsText). A PATCH changes them under the row lock this statement takes,
// so a caller whose copy is stale is refused here (and reads them again under
// the lock) rather than judging the batch by limits MySQL no longer has.
func GuardSoldAt(ctx context.Context, tx Querier, sale string, n int64, now time.Time, perUser int64, limitsText string) (bool, error) {
	return changed(tx.ExecContext(ctx, `UPDATE sales SET sold = sold + ?, updated_at = ?
		WHERE id = ? AND closed = 0 AND sold + ? <= total AND per_user_limit = ? AND COALESCE(limits, '') = BINARY ?`,
		n, now, sale, n, perUser, limitsText))
}

// GuardRegion adds n units to a region's sold count if they fit its total.
func GuardRegion(ctx context.Context, tx Querier, sale, region string, n int64) (bool, error) {
	return changed(tx.ExecContext(ctx, `UPDATE sale_regions SET sold = sold + ?
		WHERE sale_id = ? AND region = ? AND sold + ? <= total`, n, sale, region, n))
}

// LockBuyers locks the rows of users that MySQL has and answers the units
// each holds (a buyer new to the sale is absent).
func LockBuyers(ctx context.Context, tx Querier, sale string, users []string) (map[string]int64, error) {
	held := make(map[string]int64, len(users))
	for part := range slices.Chunk(users, sqlChunk) {
		args := make([]any, 0, len(part)+1)
		args = append(args, sale)
		for _, u := range part {
			args = append(args, u)
		}
		rows, err := tx.QueryContext(ctx, `SELECT user_id, units FROM user_purchases
			WHERE sale_id = ? AND user_id IN (`+placeholders(len(part))+`) FOR UPDATE`, args...)
		if err != nil {
			return nil, err
		}
		err = scanRows(rows, func() error {
			var u string
			var n int64
			err := rows.Scan(&u, &n)
			held[u] = n
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	return held, nil
}

// AddBuyerUnits adds each buyer's units (after LockBuyers checked them).
func AddBuyerUnits(ctx context.Context, tx Querier, sale string, units map[string]int64) error {
	for part := range slices.Chunk(sortedKeys(units), sqlChunk) {
		args := make([]any, 0, 3*len(part))
		for _, u := range part {
			args = append(args, sale, u, units[u])
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO user_purchases (sale_id, user_id, units) VALUES `+
			rowsOf(len(part), 3)+` ON DUPLICATE KEY UPDATE units = units + VALUES(units)`, args...); err != nil {
			return err
		}
	}
	return nil
}

// GuardBuyer adds n units to one buyer's count if it stays within limit.
func GuardBuyer(ctx context.Context, tx Querier, sale, user string, n, limit int64) (bool, error) {
	if _, err := tx.ExecContext(ctx, `INSERT IGNORE INTO user_purchases (sale_id, user_id, units) VALUES (?, ?, 0)`,
		sale, user); err != nil {
		return false, err
	}
	return changed(tx.ExecContext(ctx, `UPDATE user_purchases SET units = units + ?
		WHERE sale_id = ? AND user_id = ? AND units + ? <= ?`, n, sale, user, n, limit))
}

// Usage is a batch's charge to one limit counter, and the limit's bound.
type Usage struct {
	UsageKey
	Dimension flashgate.Dimension
	Inc, Max  int64
}

// ChargeBatch adds a batch's usage to limit_usage and checks every row it
// touched against its limit, under those rows' locks (the sale row lock,
// taken first, already serialises the sale's batches); false when any is
// over, and the caller rolls back. usage is in SortedUsage order.
func ChargeBatch(ctx context.Context, tx Querier, sale string, usage []Usage) (bool, error) {
	for part := range slices.Chunk(usage, sqlChunk) {
		args := make([]any, 0, 6*len(part))
		for _, u := range part {
			args = append(args, sale, u.Lim, u.Window, u.Subject, string(u.Dimension), u.Inc)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO limit_usage (sale_id, lim, window_id, subject, dimension, used)
			VALUES `+rowsOf(len(part), 6)+` ON DUPLICATE KEY UPDATE used = used + VALUES(used)`, args...); err != nil {
			return false, err
		}
		var over int
		q := strings.Builder{}
		args = args[:0]
		args = append(args, sale)
		for i, u := range part {
			if i > 0 {
				q.WriteString(" OR ")
			}
			q.WriteString("(lim = ? AND window_id = ? AND subject = ? AND used > ?)")
			args = append(args, u.Lim, u.Window, u.Subject, u.Max)
		}
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM limit_usage WHERE sale_id = ? AND (`+q.String()+`)`,
			args...).Scan(&over); err != nil {
			return false, err
		}
		if over > 0 {
			return false, nil
		}
	}
	return true, nil
}

// GuardLimit adds one order's charge to a limit counter if it stays within
// the limit's max.
func GuardLimit(ctx context.Context, tx Querier, sale string, u Usage) (bool, error) {
	if _, err := tx.ExecContext(ctx, `INSERT IGNORE INTO limit_usage (sale_id, lim, window_id, subject, dimension, used)
		VALUES (?, ?, ?, ?, ?, 0)`, sale, u.Lim, u.Window, u.Subject, string(u.Dimension)); err != nil {
		return false, err
	}
	return changed(tx.ExecContext(ctx, `UPDATE limit_usage SET used = used + ?
		WHERE sale_id = ? AND lim = ? AND window_id = ? AND subject = ? AND used + ? <= ?`,
		u.Inc, sale, u.Lim, u.Window, u.Subject, u.Inc, u.Max))
}

// Savepoint marks where one order's guards begin; RollbackOrder undoes them.
func Savepoint(ctx context.Context, tx Querier) error {
	_, err := tx.ExecContext(ctx, `SAVEPOINT fg_order`)
	return err
}

// RollbackOrder undoes one order's guards back to its Savepoint.
func RollbackOrder(ctx context.Context, tx Querier) error {
	_, err := tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT fg_order`)
	return err
}

// ReturnUnits cancels orders (confirmed, locked, of sale, whose row the
// caller holds) with reason and takes their units off sales.sold,
// sale_regions.sold, user_purchases.units (not for a buyer's cancel) and
// limit_usage.used, in the writer's order: sales, regions, users, limits,
// orders.
func ReturnUnits(ctx context.Context, tx Querier, sale string, orders []flashgate.Order, reason string, now time.Time) error {
	var units int64
	regions := map[string]int64{}
	users := map[string]int64{}
	usage := map[UsageKey]int64{}
	for _, o := range orders {
		units += o.Quantity
		if o.Region != "" {
			regions[o.Region] += o.Quantity
		}
		users[o.UserID] += o.Quantity
		cs, err := flashgate.ParseCharges(o.Charges)
		if err != nil {
			return fmt.Errorf("sale %s order %d: %w", sale, o.ID, err)
		}
		for _, c := range cs {
			usage[UsageKey{c.Limit, c.Window, c.Subject}] += c.Inc
		}
	}
	now = now.UTC()
	if err := returnSold(ctx, tx, sale, units, regions, now); err != nil {
		return err
	}
	// A buyer's cancel keeps the buyer's quota taken for the rest of the sale
	// (lua/restock.lua does the same in Redis): the units go back on sale,
	// the buyer does not get to buy them again.
	if reason != flashgate.ReasonCanceled {
		if err := returnBuyers(ctx, tx, sale, users); err != nil {
			return err
		}
	}
	if err := uncharge(ctx, tx, sale, usage); err != nil {
		return err
	}
	return cancelRows(ctx, tx, sale, orders, reason, now)
}

func returnSold(ctx context.Context, tx Querier, sale string, units int64, regions map[string]int64, now time.Time) error {
	ok, err := changed(tx.ExecContext(ctx, `UPDATE sales SET sold = sold - ?, updated_at = ? WHERE id = ?`, units, now, sale))
	if err != nil {
		return fmt.Errorf("sale %s: %w", sale, err)
	} else if !ok {
		return fmt.Errorf("sale %s: %w", sale, ErrSaleNotFound)
	}
	for _, region := range sortedKeys(regions) {
		if _, err := tx.ExecContext(ctx, `UPDATE sale_regions SET sold = sold - ? WHERE sale_id = ? AND region = ?`,
			regions[region], sale, region); err != nil {
			return fmt.Errorf("sale %s region %s: %w", sale, region, err)
		}
	}
	return nil
}

func returnBuyers(ctx context.Context, tx Querier, sale string, users map[string]int64) error {
	for part := range slices.Chunk(sortedKeys(users), sqlChunk) {
		var q strings.Builder
		args := make([]any, 0, 3*len(part)+1)
		q.WriteString(`UPDATE user_purchases SET units = units - CASE user_id`)
		for _, u := range part {
			q.WriteString(` WHEN ? THEN ?`)
			args = append(args, u, users[u])
		}
		q.WriteString(` END WHERE sale_id = ? AND user_id IN (` + placeholders(len(part)) + `)`)
		args = append(args, sale)
		for _, u := range part {
			args = append(args, u)
		}
		if _, err := tx.ExecContext(ctx, q.String(), args...); err != nil {
			return fmt.Errorf("sale %s: buyers: %w", sale, err)
		}
	}
	return nil
}

func cancelRows(ctx context.Context, tx Querier, sale string, orders []flashgate.Order, reason string, now time.Time) error {
	for part := range slices.Chunk(orders, sqlChunk) {
		args := make([]any, 0, len(part)+3)
		args = append(args, string(flashgate.OrderCanceled), reason, now)
		for _, o := range part {
			args = append(args, o.ID)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = ?, reason = ?, updated_at = ?, event_seq = event_seq + 1
			WHERE id IN (`+placeholders(len(part))+`)`, args...); err != nil {
			return fmt.Errorf("sale %s: cancel orders: %w", sale, err)
		}
		ids := make([]uint64, len(part))
		for i, o := range part {
			ids[i] = o.ID
		}
		if err := recordEvents(ctx, tx, ids); err != nil {
			return fmt.Errorf("sale %s: %w", sale, err)
		}
	}
	return nil
}

// uncharge takes canceled orders' usage off limit_usage.
func uncharge(ctx context.Context, tx Querier, sale string, usage map[UsageKey]int64) error {
	keys := SortedUsage(usage)
	for part := range slices.Chunk(keys, sqlChunk/2) {
		var q, where strings.Builder
		args := make([]any, 0, 7*len(part)+1)
		q.WriteString(`UPDATE limit_usage SET used = used - CASE`)
		for i, k := range part {
			q.WriteString(` WHEN lim = ? AND window_id = ? AND subject = ? THEN ?`)
			args = append(args, k.Lim, k.Window, k.Subject, usage[k])
			if i > 0 {
				where.WriteString(" OR ")
			}
			where.WriteString(`(lim = ? AND window_id = ? AND subject = ?)`)
		}
		args = append(args, sale)
		for _, k := range part {
			args = append(args, k.Lim, k.Window, k.Subject)
		}
		q.WriteString(` ELSE 0 END WHERE sale_id = ? AND (` + where.String() + `)`)
		if _, err := tx.ExecContext(ctx, q.String(), args...); err != nil {
			return fmt.Errorf("sale %s: limits: %w", sale, err)
		}
	}
	return nil
}
