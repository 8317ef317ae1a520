package flashgate

import (
	"errors"
	"testing"
	"time"
)

// Every pair of statuses: the moves the life cycle allows, and no other.
func TestOrderTransitions(t *testing.T) {
	all := []OrderStatus{OrderPending, OrderProcessing, OrderReleased, OrderConfirmed, OrderPaid, OrderCanceled, OrderFailed}
	allowed := map[[2]OrderStatus]bool{
		{OrderPending, OrderProcessing}:   true, // claim.lua
		{OrderPending, OrderReleased}:     true, // release.lua, mode gateway
		{OrderPending, OrderConfirmed}:    true, // the writer, unclaimed
		{OrderPending, OrderFailed}:       true, // the writer, or release.lua mode backend
		{OrderProcessing, OrderConfirmed}: true,
		{OrderProcessing, OrderFailed}:    true,
		{OrderConfirmed, OrderPaid}:       true, // pay
		{OrderConfirmed, OrderCanceled}:   true, // cancel, or expiry
	}
	for _, from := range all {
		for _, to := range all {
			if got, want := from.CanBecome(to), allowed[[2]OrderStatus{from, to}]; got != want {
				t.Errorf("%s → %s: %v, want %v", from, to, got, want)
			}
		}
	}
	for _, s := range all {
		final := s == OrderPaid || s == OrderCanceled || s == OrderFailed || s == OrderReleased
		if s.Final() != final {
			t.Errorf("%s.Final() = %v", s, s.Final())
		}
	}
	if OrderStatus("shipped").CanBecome(OrderPaid) || OrderPending.CanBecome("shipped") {
		t.Error("an unknown status moves")
	}
}

func TestOrderLifecycle(t *testing.T) {
	due := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	confirmed := Order{ID: 1, Status: OrderConfirmed, ExpiresAt: due}
	for _, tc := range []struct {
		name       string
		from       Order
		act        func(*Order) error
		wantStatus OrderStatus
		wantReason string
	}{
		{"pay before the deadline", confirmed, func(o *Order) error { return o.Pay(due.Add(-time.Millisecond)) }, OrderPaid, ""},
		{"pay at the deadline", confirmed, func(o *Order) error { return o.Pay(due) }, "", ""},
		{"pay a paid order", Order{Status: OrderPaid}, func(o *Order) error { return o.Pay(due) }, "", ""},
		{"pay a pending order", Order{Status: OrderPending, ExpiresAt: due}, func(o *Order) error { return o.Pay(due.Add(-time.Hour)) }, "", ""},
		{"cancel", confirmed, (*Order).Cancel, OrderCanceled, ReasonCanceled},
		{"cancel a paid order", Order{Status: OrderPaid}, (*Order).Cancel, "", ""},
		{"cancel a canceled order", Order{Status: OrderCanceled, Reason: ReasonExpired}, (*Order).Cancel, "", ""},
		{"expire at the deadline", confirmed, func(o *Order) error { return o.Expire(due) }, OrderCanceled, ReasonExpired},
		{"expire before the deadline", confirmed, func(o *Order) error { return o.Expire(due.Add(-time.Millisecond)) }, "", ""},
		{"expire a paid order", Order{Status: OrderPaid, ExpiresAt: due}, func(o *Order) error { return o.Expire(due.Add(time.Hour)) }, "", ""},
		{"fail a claimed order", Order{Status: OrderProcessing}, func(o *Order) error { return o.Move(OrderFailed, ReasonSoldOut) }, OrderFailed, ReasonSoldOut},
		{"release a claimed order", Order{Status: OrderProcessing}, func(o *Order) error { return o.Move(OrderReleased, ReasonPublishFailed) }, "", ""},
		{"confirm a failed order", Order{Status: OrderFailed, Reason: ReasonSoldOut}, func(o *Order) error { return o.Move(OrderConfirmed, "") }, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.from
			err := tc.act(&o)
			if tc.wantStatus == "" {
				if !errors.Is(err, ErrTransition) || !errors.Is(err, ErrInvalid) || o != tc.from {
					t.Fatalf("err %v, order %+v; want ErrTransition and the order unchanged", err, o)
				}
				return
			}
			if err != nil || o.Status != tc.wantStatus || o.Reason != tc.wantReason {
				t.Fatalf("err %v, order %s/%s; want %s/%s", err, o.Status, o.Reason, tc.wantStatus, tc.wantReason)
			}
		})
	}
}

func TestOrderStatusPublicAndLive(t *testing.T) {
	for s, want := range map[OrderStatus]OrderStatus{OrderPending: OrderPending, OrderProcessing: OrderPending,
		OrderConfirmed: OrderConfirmed, OrderPaid: OrderPaid, OrderCanceled: OrderCanceled, OrderFailed: OrderFailed} {
		if s.Public() != want {
			t.Errorf("%s.Public() = %s, want %s", s, s.Public(), want)
		}
	}
	for s, want := range map[OrderStatus]bool{OrderPending: true, OrderConfirmed: true, OrderPaid: true,
		OrderProcessing: true, OrderReleased: false, OrderCanceled: false, OrderFailed: false} {
		if s.Live() != want {
			t.Errorf("%s.Live() = %v", s, s.Live())
		}
	}
}

// An order rebuilt from a record gets its facts back from its charges.
func TestFactsFromChargesSkipsBadCharges(t *testing.T) {
	o := Order{Charges: "not charges", Phone: "+1"}
	o.FactsFromCharges([]Limit{{Dimension: DimPhone, Max: 1}})
	if o.Phone != "+1" {
		t.Fatalf("bad charges changed the facts: %+v", o)
	}
}
