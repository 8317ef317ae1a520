package flashgate

import "time"

// OrderEvent is one status change of an order, as downstream consumers
// receive it (docs/events.md, api/asyncapi.yaml): written to MySQL's outbox
// in the transaction that made the change, published once per change, in
// order per order.
type OrderEvent struct {
	// ID is unique and stable ("<order id>-<seq>"): consumers drop a second
	// copy of an event by it.
	ID string `json:"event_id"`
	// Type is what happened: confirmed, failed, paid, canceled or expired
	// (an order canceled because its payment deadline passed).
	Type    EventType `json:"type"`
	OrderID uint64    `json:"order_id,string"`
	// Seq counts the order's changes from 1: an order's events in seq order
	// are its history.
	Seq    uint32 `json:"seq"`
	SaleID string `json:"sale_id"`
	UserID string `json:"user_id"`
	// Status and Reason are the order's after the change.
	Status   OrderStatus `json:"status"`
	Reason   string      `json:"reason"`
	Quantity int64       `json:"quantity"`
	Region   string      `json:"region"`
	// AmountCents is the sale's price times the quantity (nil: an order of a
	// sale MySQL does not know).
	AmountCents *int64 `json:"amount_cents"`
	// At is MySQL's time of the transaction that made the change.
	At time.Time `json:"occurred_at"`
}

// EventType is what an order event says happened.
type EventType string

// The event types: one per status an order can take in MySQL, and expired
// for a cancel by the payment deadline.
const (
	EventConfirmed EventType = "confirmed"
	EventFailed    EventType = "failed"
	EventPaid      EventType = "paid"
	EventCanceled  EventType = "canceled"
	EventExpired   EventType = "expired"
)
