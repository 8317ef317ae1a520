package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/flashgate/flashgate"
)

// ErrNoOrder is an order MySQL has no row of.
var ErrNoOrder = errors.New("no such order")

// OrderState is MySQL's word on one order.
type OrderState struct {
	Status flashgate.OrderStatus
	Reason string
	// OtherSale: MySQL's row of this id is an order of another sale (OrderStates
	// was asked about one sale); Status and Reason are empty. The id was used
	// twice (a broken id source): the asking order is not that row.
	OtherSale bool
}

const orderCols = `id, sale_id, user_id, quantity, region, status, reason, COALESCE(idem_key, ''), created_at, expires_at, charges`

// scanOrder reads one order as MySQL holds it: a flashgate.Order without
// the buyer's facts (the row keeps the charges they made; FactsFromCharges
// brings them back where they are needed).
func scanOrder(row interface{ Scan(...any) error }) (flashgate.Order, error) {
	var o flashgate.Order
	var st string
	err := row.Scan(&o.ID, &o.SaleID, &o.UserID, &o.Quantity, &o.Region, &st, &o.Reason, &o.IdemKey, &o.CreatedAt, &o.ExpiresAt, &o.Charges)
	o.Status = flashgate.OrderStatus(st)
	return o, err
}

// scanOrders calls fn for each order the query answers.
func scanOrders(ctx context.Context, q Querier, fn func(flashgate.Order) error, query string, args ...any) error {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	return scanRows(rows, func() error {
		o, err := scanOrder(rows)
		if err != nil {
			return err
		}
		return fn(o)
	})
}

// Order reads one order of sale (no lock); ErrNoOrder when there is none.
func Order(ctx context.Context, q Querier, sale string, id uint64) (flashgate.Order, error) {
	o, err := scanOrder(q.QueryRowContext(ctx, `SELECT `+orderCols+` FROM orders WHERE id = ? AND sale_id = ?`, id, sale))
	if errors.Is(err, sql.ErrNoRows) {
		return o, ErrNoOrder
	}
	return o, err
}

// LockOrder reads one order of sale and locks its row; ErrNoOrder when there
// is none.
func LockOrder(ctx context.Context, tx Querier, sale string, id uint64) (flashgate.Order, error) {
	o, err := scanOrder(tx.QueryRowContext(ctx, `SELECT `+orderCols+` FROM orders WHERE id = ? AND sale_id = ? FOR UPDATE`, id, sale))
	if errors.Is(err, sql.ErrNoRows) {
		return o, ErrNoOrder
	}
	if err != nil {
		return o, fmt.Errorf("order %d: %w", id, err)
	}
	return o, nil
}

// LockExpired locks those of ids (orders of sale) still confirmed and past
// their deadline at now.
func LockExpired(ctx context.Context, tx Querier, sale string, ids []uint64, now time.Time) ([]flashgate.Order, error) {
	args := make([]any, 0, len(ids)+3)
	for _, id := range ids {
		args = append(args, id)
	}
	args = append(args, sale, string(flashgate.OrderConfirmed), now.UTC())
	var orders []flashgate.Order
	err := scanOrders(ctx, tx, func(o flashgate.Order) error {
		orders = append(orders, o)
		return nil
	}, `SELECT `+orderCols+` FROM orders WHERE id IN (`+placeholders(len(ids))+`)
			AND sale_id = ? AND status = ? AND expires_at <= ? FOR UPDATE`, args...)
	return orders, err
}

// DueOrders lists up to limit confirmed orders whose payment deadline is at
// or before now, oldest deadline first, grouped by sale (sales in the order
// their first order came).
func DueOrders(ctx context.Context, db Querier, now time.Time, limit int) (sales []string, bySale map[string][]uint64, err error) {
	rows, err := db.QueryContext(ctx, `SELECT sale_id, id FROM orders WHERE status = ? AND expires_at <= ?
		ORDER BY expires_at LIMIT ?`, string(flashgate.OrderConfirmed), now.UTC(), limit)
	if err != nil {
		return nil, nil, err
	}
	bySale = map[string][]uint64{}
	err = scanRows(rows, func() error {
		var sale string
		var id uint64
		if err := rows.Scan(&sale, &id); err != nil {
			return err
		}
		if _, ok := bySale[sale]; !ok {
			sales = append(sales, sale)
		}
		bySale[sale] = append(bySale[sale], id)
		return nil
	})
	return sales, bySale, err
}

// EachCanceledSince calls fn for every order of sale canceled (or expired)
// at or after since.
func EachCanceledSince(ctx context.Context, db Querier, sale string, since time.Time, fn func(flashgate.Order) error) error {
	return scanOrders(ctx, db, fn, `SELECT `+orderCols+` FROM orders WHERE sale_id = ? AND status = ? AND updated_at >= ?`,
		sale, string(flashgate.OrderCanceled), since.UTC())
}

// EachOrder calls fn for every order of sale.
func EachOrder(ctx context.Context, db Querier, sale string, fn func(flashgate.Order) error) error {
	return scanOrders(ctx, db, fn, `SELECT `+orderCols+` FROM orders WHERE sale_id = ?`, sale)
}

// EachBuyer calls fn for every buyer of sale holding units, with the units.
func EachBuyer(ctx context.Context, db Querier, sale string, fn func(user string, units int64) error) error {
	rows, err := db.QueryContext(ctx, `SELECT user_id, units FROM user_purchases WHERE sale_id = ? AND units > 0`, sale)
	if err != nil {
		return err
	}
	return scanRows(rows, func() error {
		var user string
		var units int64
		if err := rows.Scan(&user, &units); err != nil {
			return err
		}
		return fn(user, units)
	})
}

// EachLimitUsage calls fn for every purchase-limit counter of sale above
// zero, window by window.
func EachLimitUsage(ctx context.Context, db Querier, sale string, fn func(lim int, window, subject string, used int64) error) error {
	rows, err := db.QueryContext(ctx, `SELECT lim, window_id, subject, used FROM limit_usage
		WHERE sale_id = ? AND used > 0 ORDER BY window_id`, sale)
	if err != nil {
		return err
	}
	return scanRows(rows, func() error {
		var lim int
		var win, subject string
		var used int64
		if err := rows.Scan(&lim, &win, &subject, &used); err != nil {
			return err
		}
		return fn(lim, win, subject, used)
	})
}

// OrderStates reads which of ids MySQL has as orders of sale: their status
// and reason. An id whose row is an order of another sale answers
// OrderState{OtherSale: true}: the row says nothing about sale's order of that
// id (order ids are the table's primary key, so that order can have no row).
func OrderStates(ctx context.Context, q Querier, sale string, ids []uint64) (map[uint64]OrderState, error) {
	res := make(map[uint64]OrderState, len(ids))
	for part := range slices.Chunk(ids, sqlChunk) {
		args := make([]any, len(part))
		for i, id := range part {
			args[i] = id
		}
		rows, err := q.QueryContext(ctx, `SELECT id, sale_id, status, reason FROM orders WHERE id IN (`+placeholders(len(part))+`)`, args...)
		if err != nil {
			return nil, err
		}
		err = scanRows(rows, func() error {
			var id uint64
			var of, st, reason string
			err := rows.Scan(&id, &of, &st, &reason)
			if of != sale {
				res[id] = OrderState{OtherSale: true}
			} else {
				res[id] = OrderState{Status: flashgate.OrderStatus(st), Reason: reason}
			}
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	return res, nil
}

// IdemKey is an Idempotency-Key of one buyer.
type IdemKey struct{ User, Idem string }

// KeyHolders answers, for the keys given, the order of sale that holds each
// (keys no order holds are absent).
func KeyHolders(ctx context.Context, tx Querier, sale string, keys []IdemKey) (map[IdemKey]uint64, error) {
	holder := map[IdemKey]uint64{}
	for part := range slices.Chunk(keys, sqlChunk) {
		args := make([]any, 0, 2*len(part)+1)
		args = append(args, sale)
		for _, k := range part {
			args = append(args, k.User)
		}
		for _, k := range part {
			args = append(args, k.Idem)
		}
		rows, err := tx.QueryContext(ctx, `SELECT id, user_id, idem_key FROM orders WHERE sale_id = ?
			AND user_id IN (`+placeholders(len(part))+`) AND idem_key IN (`+placeholders(len(part))+`)`, args...)
		if err != nil {
			return nil, err
		}
		err = scanRows(rows, func() error {
			var id uint64
			var k IdemKey
			err := rows.Scan(&id, &k.User, &k.Idem)
			holder[k] = id
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	return holder, nil
}

// InsertOrders writes the rows of orders as they are (status, reason, key),
// and their first events.
func InsertOrders(ctx context.Context, tx Querier, orders []flashgate.Order, now time.Time) error {
	for part := range slices.Chunk(orders, sqlChunk) {
		args := make([]any, 0, 13*len(part))
		ids := make([]uint64, len(part))
		for i, o := range part {
			var idem any
			if o.IdemKey != "" {
				idem = o.IdemKey
			}
			args = append(args, o.ID, o.SaleID, o.UserID, o.Quantity, o.Region, string(o.Status), o.Reason, idem,
				o.CreatedAt.UTC(), o.ExpiresAt.UTC(), now, o.Charges, 1)
			ids[i] = o.ID
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, sale_id, user_id, quantity, region, status, reason,
			idem_key, created_at, expires_at, updated_at, charges, event_seq) VALUES `+rowsOf(len(part), 13), args...); err != nil {
			return fmt.Errorf("insert orders: %w", err)
		}
		if err := recordEvents(ctx, tx, ids); err != nil {
			return err
		}
	}
	return nil
}

// InsertFailed writes o as failed (its status and reason as given), unless
// MySQL has a row of it; true when it wrote it (with its event, in one
// transaction). Failed orders count nowhere: no counter moves.
func InsertFailed(ctx context.Context, db *sql.DB, o flashgate.Order, now time.Time) (bool, error) {
	var idem any
	if o.IdemKey != "" {
		idem = o.IdemKey
	}
	tx, err := Begin(ctx, db)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `INSERT INTO orders (id, sale_id, user_id, quantity, region, status, reason,
		idem_key, created_at, expires_at, updated_at, event_seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1)
		ON DUPLICATE KEY UPDATE id = id`,
		o.ID, o.SaleID, o.UserID, o.Quantity, o.Region, string(o.Status), o.Reason, idem, o.CreatedAt.UTC(), o.ExpiresAt.UTC(), now)
	if err != nil {
		return false, err
	}
	n, _ := res.RowsAffected() // 1: inserted; 0: the row was there
	if n == 1 {
		if err := recordEvents(ctx, tx, []uint64{o.ID}); err != nil {
			return false, err
		}
	}
	return n == 1, tx.Commit()
}

// OrderStateOf reads the status and reason of sale's order id; ErrNoOrder
// when MySQL has no row of it. A row of another sale under that id answers
// OrderState{OtherSale: true} (as OrderStates): it is not this order's.
func OrderStateOf(ctx context.Context, db Querier, sale string, id uint64) (OrderState, error) {
	var st OrderState
	var of, status string
	err := db.QueryRowContext(ctx, `SELECT sale_id, status, reason FROM orders WHERE id = ?`, id).Scan(&of, &status, &st.Reason)
	if errors.Is(err, sql.ErrNoRows) {
		return st, ErrNoOrder
	}
	if err == nil && of != sale {
		return OrderState{OtherSale: true}, nil
	}
	st.Status = flashgate.OrderStatus(status)
	return st, err
}

// sortedKeys lists m's keys in order: every writer locks rows in one order,
// so two never lock them crosswise.
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// UsageKey is one row of limit_usage of a sale.
type UsageKey struct {
	Lim     int
	Window  string
	Subject string
}

// SortedUsage lists usage's rows in one order for every writer, so that two
// never lock them crosswise.
func SortedUsage(usage map[UsageKey]int64) []UsageKey {
	keys := make([]UsageKey, 0, len(usage))
	for k := range usage {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b UsageKey) int {
		if a.Lim != b.Lim {
			return a.Lim - b.Lim
		}
		if c := strings.Compare(a.Window, b.Window); c != 0 {
			return c
		}
		return strings.Compare(a.Subject, b.Subject)
	})
	return keys
}
