package mysql

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/flashgate/flashgate"
)

// Payment is what an order's row keeps of the payment that paid it
// (migration 0010): the payment service's id and the amount it took.
type Payment struct {
	ID          string
	AmountCents int64
}

// LockSalePrice locks the sale row, as every writer takes it first, and
// reads the sale's price; found is false for a sale MySQL does not have.
func LockSalePrice(ctx context.Context, tx Querier, id string) (price int64, found bool, err error) {
	err = tx.QueryRowContext(ctx, `SELECT price_cents FROM sales WHERE id = ? FOR UPDATE`, id).Scan(&price)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return price, err == nil, err
}

// Now is MySQL's clock, read in the caller's transaction: what decides
// whether an order is past its deadline (invariant 8).
func Now(ctx context.Context, q Querier) (time.Time, error) {
	var now time.Time
	err := q.QueryRowContext(ctx, `SELECT UTC_TIMESTAMP(3)`).Scan(&now)
	return now.UTC(), err
}

// PaymentOf reads the payment recorded on order id (zero for none).
func PaymentOf(ctx context.Context, q Querier, id uint64) (Payment, error) {
	var pid sql.NullString
	var amount sql.NullInt64
	err := q.QueryRowContext(ctx, `SELECT payment_id, amount_cents FROM orders WHERE id = ?`, id).Scan(&pid, &amount)
	if errors.Is(err, sql.ErrNoRows) {
		return Payment{}, ErrNoOrder
	}
	return Payment{ID: pid.String, AmountCents: amount.Int64}, err
}

// PaidOrderOf answers the order a payment id paid (0: none).
func PaidOrderOf(ctx context.Context, q Querier, paymentID string) (uint64, error) {
	var id uint64
	err := q.QueryRowContext(ctx, `SELECT id FROM orders WHERE payment_id = ?`, paymentID).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return id, err
}

// MarkPaid records payment p of an order whose row the caller holds: its
// status, and the payment's id and amount, and its event (docs/events.md),
// in the caller's transaction.
func MarkPaid(ctx context.Context, tx Querier, id uint64, p Payment, now time.Time) error {
	if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = ?, payment_id = ?, amount_cents = ?, updated_at = ?, event_seq = event_seq + 1 WHERE id = ?`,
		string(flashgate.OrderPaid), p.ID, p.AmountCents, now.UTC(), id); err != nil {
		return err
	}
	return recordEvents(ctx, tx, []uint64{id})
}
