package flashgate

import "fmt"

// Payment is the payment service's word that an order was paid: the body of
// POST /v1/payments, and what a backend records on the order's row.
type Payment struct {
	OrderID     uint64 `json:"order_id,string"`
	SaleID      string `json:"sale_id"`
	PaymentID   string `json:"payment_id"`
	AmountCents int64  `json:"amount_cents"`
}

// maxPaymentIDBytes bounds a payment id (orders.payment_id is VARCHAR(64)).
const maxPaymentIDBytes = 64

// ValidPaymentID reports whether id is 1-64 characters of [A-Za-z0-9_.:-]:
// what payment services' ids are made of.
func ValidPaymentID(id string) bool { return ValidDevice(id) && len(id) <= maxPaymentIDBytes }

// Validate checks the payment's fields, not the order it names.
func (p *Payment) Validate() error {
	switch {
	case p.OrderID == 0:
		return fmt.Errorf("%w: order_id must be a decimal order id", ErrInvalid)
	case !ValidID(p.SaleID):
		return fmt.Errorf("%w: sale_id must be 1-64 characters of [A-Za-z0-9_-]", ErrInvalid)
	case !ValidPaymentID(p.PaymentID):
		return fmt.Errorf("%w: payment_id must be 1-64 characters of [A-Za-z0-9_.:-]", ErrInvalid)
	case p.AmountCents < 0:
		return fmt.Errorf("%w: amount_cents must not be negative", ErrInvalid)
	}
	return nil
}
