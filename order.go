package flashgate

import (
	"fmt"
	"time"
)

// OrderStatus is an order's place in its life cycle (docs/orders.md).
type OrderStatus string

const (
	// OrderPending: admitted by Redis, not yet written to MySQL.
	OrderPending OrderStatus = "pending"
	// OrderProcessing: pending, and a backend has claimed it from the stream,
	// so a gateway whose publish seemed to fail can no longer release it. Redis
	// alone keeps this status; buyers see it as pending.
	OrderProcessing OrderStatus = "processing"
	// OrderReleased: the publish failed and the gateway gave the units back:
	// no order exists. Redis alone keeps it, so that a late message is dropped;
	// buyers are told the order does not exist.
	OrderReleased OrderStatus = "released"
	// OrderConfirmed: written to MySQL under the row guard; awaits payment.
	OrderConfirmed OrderStatus = "confirmed"
	OrderPaid      OrderStatus = "paid"
	// OrderCanceled: the buyer canceled (ReasonCanceled), or it expired unpaid
	// (ReasonExpired); its units went back.
	OrderCanceled OrderStatus = "canceled"
	// OrderFailed: MySQL refused it (its reason says why); its units went back.
	OrderFailed OrderStatus = "failed"
)

// Live reports whether the order holds units: it counts against stock and
// the buyer's limit.
func (s OrderStatus) Live() bool {
	return s == OrderPending || s == OrderProcessing || s == OrderConfirmed || s == OrderPaid
}

// Public is the status a buyer is shown: a claimed order is still pending.
// (A released one is answered as not found before it gets here.)
func (s OrderStatus) Public() OrderStatus {
	if s == OrderProcessing {
		return OrderPending
	}
	return s
}

// Final reports whether no move leads out of s.
func (s OrderStatus) Final() bool { return len(transitions[s]) == 0 }

// transitions lists every move the life cycle allows; anything else is refused.
//   - admit.lua writes pending; claim.lua moves pending to processing.
//   - release.lua moves pending to released (the gateway's publish failed) and
//     pending or processing to failed (MySQL refused it, or it was dead-lettered);
//     a processing order is never released: its message got through.
//   - the backend's writer confirms or fails what it consumed (confirm.lua
//     writes that back), whether the claim ran or not.
//   - pay and cancel act on a confirmed order only; the expiry sweep cancels
//     an unpaid one with ReasonExpired. Paid, canceled, failed and released are
//     final: a paid order is not canceled, nothing is paid twice.
var transitions = map[OrderStatus][]OrderStatus{
	OrderPending:    {OrderProcessing, OrderReleased, OrderConfirmed, OrderFailed},
	OrderProcessing: {OrderConfirmed, OrderFailed},
	OrderConfirmed:  {OrderPaid, OrderCanceled},
}

// CanBecome reports whether an order in status s may move to t. Staying put
// is not a move: a repeated pay or cancel is answered as done, not redone.
func (s OrderStatus) CanBecome(t OrderStatus) bool {
	for _, n := range transitions[s] {
		if n == t {
			return true
		}
	}
	return false
}

// ErrTransition marks a status move the life cycle does not allow.
var ErrTransition = fmt.Errorf("%w: order status move", ErrInvalid)

// Order is one admitted purchase: the one model of an order. The JetStream
// message (bus), the Redis record (lua), the MySQL row and the HTTP view
// (gateway) are encodings of it, each in the package that speaks that wire.
type Order struct {
	ID       uint64
	SaleID   string
	UserID   string
	Quantity int64
	// Region is the stock the units came from; "" for a sale without regions.
	Region string
	Status OrderStatus
	// Reason says why a failed or canceled order ended so (Reason* constants).
	Reason string
	// IdemKey is the buyer's Idempotency-Key, "" without one.
	IdemKey string
	// Charges: what the order counts against the sale's purchase limits, as
	// EncodeCharges writes them.
	Charges string
	// The facts the charges follow from, normalised as Subjects (only the
	// dimensions the sale's limits count by): the backend works the charges
	// out again from them. Address is the shipping address's hash.
	Phone, Device, IP, Address string
	// CreatedAt is the admission time; ExpiresAt the payment deadline. Every
	// wire keeps them to the millisecond.
	CreatedAt time.Time
	ExpiresAt time.Time
}

// Subjects are who the order is by.
func (o *Order) Subjects() Subjects {
	return Subjects{User: o.UserID, Phone: o.Phone, Device: o.Device, IP: o.IP, Address: o.Address}
}

// FactsFromCharges fills o's facts from the subjects its charges name, for an
// order rebuilt from a record that keeps the charges the admission counted
// but not the facts: each charge of a limit of dimension d names the order's
// subject in d. Bad charges leave the facts alone (the backend refuses the
// order for them anyway).
func (o *Order) FactsFromCharges(limits []Limit) {
	cs, err := ParseCharges(o.Charges)
	if err != nil {
		return
	}
	for _, c := range cs {
		if c.Limit >= len(limits) {
			continue
		}
		switch limits[c.Limit].Dimension {
		case DimPhone:
			o.Phone = c.Subject
		case DimDevice:
			o.Device = c.Subject
		case DimIP:
			o.IP = c.Subject
		case DimAddress:
			o.Address = c.Subject
		}
	}
}

// Move sets o's status to t with reason, if the life cycle allows it.
func (o *Order) Move(t OrderStatus, reason string) error {
	if !o.Status.CanBecome(t) {
		return fmt.Errorf("%w: order %d is %s, cannot become %s", ErrTransition, o.ID, o.Status, t)
	}
	o.Status, o.Reason = t, reason
	return nil
}

// Pay records a payment at now: only a confirmed order before its deadline.
func (o *Order) Pay(now time.Time) error {
	if o.Status == OrderConfirmed && !now.Before(o.ExpiresAt) {
		return fmt.Errorf("%w: order %d expired unpaid", ErrTransition, o.ID)
	}
	return o.Move(OrderPaid, "")
}

// Cancel cancels a confirmed order for its buyer.
func (o *Order) Cancel() error { return o.Move(OrderCanceled, ReasonCanceled) }

// Expire cancels a confirmed order left unpaid past its deadline.
func (o *Order) Expire(now time.Time) error {
	if o.Status == OrderConfirmed && now.Before(o.ExpiresAt) {
		return fmt.Errorf("%w: order %d is not due until %s", ErrTransition, o.ID, o.ExpiresAt)
	}
	return o.Move(OrderCanceled, ReasonExpired)
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
	// ReasonIDTaken: MySQL holds the order's id for an order of another sale
	// (two id generators on one node id); the order has no row.
	ReasonIDTaken = "order_id_taken"
	// ReasonDuplicate: another order of the same sale, user and Idempotency-Key
	// reached MySQL first (a retry admitted again after Redis lost its data).
	ReasonDuplicate = "duplicate_idempotency_key"
	// ReasonUnadmitted: no admission can have made the message's order (its
	// quantity, times or window do not fit the sale, or Redis has no trace of
	// an order newer than the sale's last rebuild): a forged or broken
	// publisher. It takes nothing (docs/ingest.md, "The backend trusts no
	// message").
	ReasonUnadmitted = "unadmitted"
)
