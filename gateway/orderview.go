package gateway

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/flashgate/flashgate"
)

// orderView is an order as GET /v1/sales/{sale}/orders/{order} and the pay
// and cancel answers show it (docs/orders.md):
//
//	{"order_id":"7345119871795200001","sale_id":"sale-1","user_id":"user_42","quantity":2,
//	 "region":"bj","status":"pending","reason":"","created_at":"2026-01-01T00:00:00Z",
//	 "expires_at":"2026-01-01T00:15:00Z"}
//
// The id is a string (JavaScript loses precision past 2^53); times are RFC
// 3339 in UTC; the status is the public one (a claimed order shows pending).
// The buyer's facts, charges and idempotency key are not shown.
type orderView struct {
	OrderID   string    `json:"order_id"`
	SaleID    string    `json:"sale_id"`
	UserID    string    `json:"user_id"`
	Quantity  int64     `json:"quantity"`
	Region    string    `json:"region"`
	Status    string    `json:"status"`
	Reason    string    `json:"reason"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// encodeOrderView is o as the HTTP API shows it.
func encodeOrderView(o *flashgate.Order) ([]byte, error) {
	return json.Marshal(orderView{
		OrderID: strconv.FormatUint(o.ID, 10), SaleID: o.SaleID, UserID: o.UserID, Quantity: o.Quantity,
		Region: o.Region, Status: string(o.Status.Public()), Reason: o.Reason,
		CreatedAt: o.CreatedAt.UTC(), ExpiresAt: o.ExpiresAt.UTC(),
	})
}

// decodeOrderView reads the view back: what a client of the API gets.
func decodeOrderView(b []byte) (flashgate.Order, error) {
	var v orderView
	if err := json.Unmarshal(b, &v); err != nil {
		return flashgate.Order{}, err
	}
	id, err := strconv.ParseUint(v.OrderID, 10, 64)
	if err != nil {
		return flashgate.Order{}, fmt.Errorf("order view: order_id %q: %w", v.OrderID, err)
	}
	return flashgate.Order{ID: id, SaleID: v.SaleID, UserID: v.UserID, Quantity: v.Quantity, Region: v.Region,
		Status: flashgate.OrderStatus(v.Status), Reason: v.Reason, CreatedAt: v.CreatedAt, ExpiresAt: v.ExpiresAt}, nil
}
