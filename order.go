package flashgate

import "time"

// OrderStatus is an order's place in its life cycle (DESIGN.md §3).
type OrderStatus string

const (
	// OrderPending: admitted by Redis, not yet written to MySQL.
	OrderPending OrderStatus = "pending"
	// OrderConfirmed: written to MySQL under the row guard; awaits payment.
	OrderConfirmed OrderStatus = "confirmed"
	OrderPaid      OrderStatus = "paid"
	OrderCanceled  OrderStatus = "canceled"
	// OrderFailed: MySQL refused it (its reason says why); its units went back.
	OrderFailed OrderStatus = "failed"
)

// Live reports whether the order holds units: it counts against stock and
// the buyer's limit.
func (s OrderStatus) Live() bool {
	return s == OrderPending || s == OrderConfirmed || s == OrderPaid
}

// Order is one admitted purchase.
type Order struct {
	ID        uint64      `json:"-"`
	SaleID    string      `json:"sale_id"`
	UserID    string      `json:"user_id"`
	Quantity  int64       `json:"quantity"`
	Region    string      `json:"region"`
	Status    OrderStatus `json:"status"`
	Reason    string      `json:"reason"`
	IdemKey   string      `json:"-"`
	CreatedAt time.Time   `json:"created_at"`
	ExpiresAt time.Time   `json:"expires_at"`
}

// LimitReason is why MySQL failed an order over a purchase limit of dimension
// d: "limit_reached:phone".
func LimitReason(d Dimension) string { return ReasonLimitReached + ":" + string(d) }

// Reasons an order ends failed or canceled; also the words MySQL stores.
const (
	ReasonSoldOut       = "sold_out"
	ReasonLimitReached  = "limit_reached"
	ReasonSaleClosed    = "sale_closed"
	ReasonPublishFailed = "publish_failed"
	ReasonAdmitFailed   = "admit_failed"
	ReasonDeadLetter    = "dead_letter" // failed max_deliver times: dead-lettered
	ReasonCanceled      = "canceled"    // the buyer canceled
	ReasonExpired       = "expired"     // unpaid at expires_at
	ReasonUnknownSale   = "unknown_sale"
	ReasonBadCharges    = "bad_charges" // the order's limit charges do not fit the sale's limits
	// ReasonDuplicate: another order of the same sale, user and Idempotency-Key
	// reached MySQL first (a retry admitted again after Redis lost its data).
	ReasonDuplicate = "duplicate_idempotency_key"
)
