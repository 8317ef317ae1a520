package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/flashgate/flashgate"
)

// OrderByID reads one order by its id alone (ids are unique across sales);
// ErrNoOrder when there is none.
func OrderByID(ctx context.Context, q Querier, id uint64) (flashgate.Order, error) {
	o, err := scanOrder(q.QueryRowContext(ctx, `SELECT `+orderCols+` FROM orders WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return o, ErrNoOrder
	}
	if err != nil {
		return o, fmt.Errorf("order %d: %w", id, err)
	}
	return o, nil
}

// ListOrders is one page of a sale's orders (of one buyer when user != ""):
// ids above after, in id order, at most limit. The next page starts after
// the last id of this one.
func ListOrders(ctx context.Context, q Querier, sale, user string, after uint64, limit int) ([]flashgate.Order, error) {
	query, args := `SELECT `+orderCols+` FROM orders WHERE sale_id = ?`, []any{sale}
	if user != "" {
		query, args = query+` AND user_id = ?`, append(args, user)
	}
	query, args = query+` AND id > ? ORDER BY id LIMIT ?`, append(args, after, limit)
	out := []flashgate.Order{}
	err := scanOrders(ctx, q, func(o flashgate.Order) error { out = append(out, o); return nil }, query, args...)
	if err != nil {
		return nil, fmt.Errorf("orders of %s: %w", sale, err)
	}
	return out, nil
}

// DeleteDeadLettered removes the row of an order that ended failed because
// its message was dead-lettered (reason), so that the message, redriven into
// the orders stream, is written as if for the first time. A failed order
// counts nowhere: no counter moves. It answers whether it removed a row.
func DeleteDeadLettered(ctx context.Context, tx Querier, id uint64, reason string) (bool, error) {
	res, err := tx.ExecContext(ctx, `DELETE FROM orders WHERE id = ? AND status = ? AND reason = ?`, id, string(flashgate.OrderFailed), reason)
	if err != nil {
		return false, fmt.Errorf("order %d: %w", id, err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// RestoreDeadLettered puts back the failed row of o that DeleteDeadLettered
// removed, as it was: no status changed, so no order event is recorded, and
// its event sequence goes on from eventSeq (the removed row's).
func RestoreDeadLettered(ctx context.Context, db Querier, o flashgate.Order, eventSeq int64, now time.Time) error {
	var idem any
	if o.IdemKey != "" {
		idem = o.IdemKey
	}
	_, err := db.ExecContext(ctx, `INSERT INTO orders (id, sale_id, user_id, quantity, region, status, reason,
		idem_key, created_at, expires_at, updated_at, event_seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON DUPLICATE KEY UPDATE id = id`,
		o.ID, o.SaleID, o.UserID, o.Quantity, o.Region, string(o.Status), o.Reason, idem, o.CreatedAt.UTC(), o.ExpiresAt.UTC(), now, eventSeq)
	if err != nil {
		return fmt.Errorf("order %d: restore: %w", o.ID, err)
	}
	return nil
}

// EventSeqOf reads the event sequence of order id (0 when it has no row).
func EventSeqOf(ctx context.Context, q Querier, id uint64) (int64, error) {
	var seq int64
	err := q.QueryRowContext(ctx, `SELECT event_seq FROM orders WHERE id = ?`, id).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return seq, err
}

// OrderLock is a MySQL named lock on one order id (GET_LOCK, on a
// connection of its own): redrives of one order run one at a time, across
// backends.
type OrderLock struct {
	conn *sql.Conn
	name string
}

// LockOrderID takes the named lock of order id in this database, waiting up
// to wait.
func LockOrderID(ctx context.Context, db *sql.DB, id uint64, wait time.Duration) (*OrderLock, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	// Named locks are the server's: the name has the database in it.
	var name string
	if err := conn.QueryRowContext(ctx, `SELECT CONCAT('fg-order-', SHA1(CONCAT(DATABASE(), '/', ?)))`, id).Scan(&name); err != nil {
		conn.Close()
		return nil, err
	}
	var got sql.NullInt64
	err = conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, ?)`, name, int(wait/time.Second)).Scan(&got)
	if err != nil || got.Int64 != 1 {
		conn.Close()
		if err == nil {
			err = fmt.Errorf("order %d: another redrive holds it", id)
		}
		return nil, err
	}
	return &OrderLock{conn: conn, name: name}, nil
}

// Release gives the lock back and the connection to the pool.
func (l *OrderLock) Release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.conn.ExecContext(ctx, `DO RELEASE_LOCK(?)`, l.name); err != nil {
		// The session may still hold it: end the session rather than pool it.
		_ = l.conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	l.conn.Close()
}
