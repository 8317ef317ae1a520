package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"

	"github.com/flashgate/flashgate"
)

// The outbox of order events (migration 0011, docs/events.md). Every
// statement that changes an order's status raises its event_seq in the same
// statement, and recordEvents then copies the order as it now stands into
// order_events, in the same transaction: the change and its event commit
// together or not at all. The publisher (the backend leader) reads the rows
// in pos order, publishes them and deletes them.

// recordEvents writes one event per order of ids, each order as the
// transaction now sees it (its row, which the caller has just changed and so
// holds locked, and its sale's price). Call it right after the statement that
// changed them, and only for the orders it changed.
func recordEvents(ctx context.Context, tx Querier, ids []uint64) error {
	for part := range slices.Chunk(ids, sqlChunk) {
		args := make([]any, 0, len(part)+3)
		args = append(args, string(flashgate.OrderCanceled), flashgate.ReasonExpired, string(flashgate.EventExpired))
		for _, id := range part {
			args = append(args, id)
		}
		// Read committed: the SELECT reads the sale row without a lock (a
		// payment, which holds only its order's row, does not queue behind
		// the sale's batches for it).
		if _, err := tx.ExecContext(ctx, `INSERT INTO order_events (event_id, order_id, seq, type, sale_id, user_id,
			status, reason, quantity, region, amount_cents, occurred_at)
			SELECT CONCAT(o.id, '-', o.event_seq), o.id, o.event_seq,
				CASE WHEN o.status = ? AND o.reason = ? THEN ? ELSE o.status END,
				o.sale_id, o.user_id, o.status, o.reason, o.quantity, o.region, s.price_cents * o.quantity, UTC_TIMESTAMP(6)
			FROM orders o LEFT JOIN sales s ON s.id = o.sale_id
			WHERE o.id IN (`+placeholders(len(part))+`) ORDER BY o.id`, args...); err != nil {
			return fmt.Errorf("order events: %w", err)
		}
	}
	return nil
}

// OutboxEvent is one row of the outbox: an event and its place.
type OutboxEvent struct {
	Pos uint64
	flashgate.OrderEvent
}

// PendingEvents reads up to limit events of the outbox, oldest first (pos
// order). An order's events are in it in seq order: each change commits
// under its order's row lock after the one before.
func PendingEvents(ctx context.Context, db Querier, limit int) ([]OutboxEvent, error) {
	rows, err := db.QueryContext(ctx, `SELECT pos, event_id, order_id, seq, type, sale_id, user_id, status, reason,
		quantity, region, amount_cents, occurred_at FROM order_events ORDER BY pos LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("order events: %w", err)
	}
	var out []OutboxEvent
	err = scanRows(rows, func() error {
		var e OutboxEvent
		var typ, st string
		var amount sql.NullInt64
		if err := rows.Scan(&e.Pos, &e.ID, &e.OrderID, &e.Seq, &typ, &e.SaleID, &e.UserID, &st, &e.Reason,
			&e.Quantity, &e.Region, &amount, &e.At); err != nil {
			return err
		}
		e.Type, e.Status, e.At = flashgate.EventType(typ), flashgate.OrderStatus(st), e.At.UTC()
		if amount.Valid {
			e.AmountCents = &amount.Int64
		}
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("order events: %w", err)
	}
	return out, nil
}

// DeleteEvents removes published events from the outbox.
func DeleteEvents(ctx context.Context, db Querier, pos []uint64) error {
	for part := range slices.Chunk(pos, sqlChunk) {
		args := make([]any, len(part))
		for i, p := range part {
			args[i] = p
		}
		if _, err := db.ExecContext(ctx, `DELETE FROM order_events WHERE pos IN (`+placeholders(len(part))+`)`, args...); err != nil {
			return fmt.Errorf("order events: delete: %w", err)
		}
	}
	return nil
}

// EventBacklog is how many events wait in the outbox and how long the oldest
// has waited, on MySQL's clock (0 when none waits).
func EventBacklog(ctx context.Context, db Querier) (n int64, oldest time.Duration, err error) {
	var us sql.NullInt64
	err = db.QueryRowContext(ctx, `SELECT COUNT(*), TIMESTAMPDIFF(MICROSECOND, MIN(occurred_at), UTC_TIMESTAMP(6))
		FROM order_events`).Scan(&n, &us)
	if err != nil {
		return 0, 0, fmt.Errorf("order events: backlog: %w", err)
	}
	return n, time.Duration(us.Int64) * time.Microsecond, nil
}

// OrderHistory is what MySQL holds of one order's changes: how many (its
// last event's seq) and its status and reason now.
type OrderHistory struct {
	Seq    uint32
	Status flashgate.OrderStatus
	Reason string
}

// OrderHistories reads, for every order of sale, its OrderHistory.
func OrderHistories(ctx context.Context, db Querier, sale string) (map[uint64]OrderHistory, error) {
	rows, err := db.QueryContext(ctx, `SELECT id, event_seq, status, reason FROM orders WHERE sale_id = ?`, sale)
	if err != nil {
		return nil, fmt.Errorf("order histories: %w", err)
	}
	out := map[uint64]OrderHistory{}
	err = scanRows(rows, func() error {
		var id uint64
		var h OrderHistory
		var st string
		err := rows.Scan(&id, &h.Seq, &st, &h.Reason)
		h.Status = flashgate.OrderStatus(st)
		out[id] = h
		return err
	})
	return out, err
}
