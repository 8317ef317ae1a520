package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

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
