package gateway

import (
	"testing"
	"time"

	"github.com/flashgate/flashgate"
)

func TestOrderViewRoundTrip(t *testing.T) {
	at := time.Date(2026, 11, 24, 9, 30, 0, 0, time.UTC)
	for _, o := range []flashgate.Order{
		{ID: 1, SaleID: "s", UserID: "u", Quantity: 1, Status: flashgate.OrderPending, CreatedAt: at, ExpiresAt: at.Add(15 * time.Minute)},
		{ID: 7345119871795200001, SaleID: "sale-1", UserID: "user_42", Quantity: 2, Region: "bj", Status: flashgate.OrderConfirmed,
			CreatedAt: at.Add(123 * time.Millisecond), ExpiresAt: at.Add(15*time.Minute + 123*time.Millisecond)},
		{ID: 1<<64 - 1, SaleID: "s", UserID: "u", Quantity: flashgate.MaxSaleUnits, Region: "abcdefghijklmnop", Status: flashgate.OrderPaid,
			CreatedAt: at, ExpiresAt: at},
		{ID: 3, SaleID: "s", UserID: "u", Quantity: 1, Status: flashgate.OrderFailed, Reason: flashgate.LimitReason(flashgate.DimPhone),
			CreatedAt: at, ExpiresAt: at},
		{ID: 4, SaleID: "s", UserID: "u", Quantity: 1, Status: flashgate.OrderCanceled, Reason: flashgate.ReasonExpired, CreatedAt: at, ExpiresAt: at},
	} {
		b, err := encodeOrderView(&o)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeOrderView(b)
		if err != nil || got != o {
			t.Errorf("round trip of %+v: %s → %+v, %v", o, b, got, err)
		}
	}
}

// What the view leaves out, and how it shows the rest.
func TestOrderViewHides(t *testing.T) {
	cst := time.FixedZone("CST", 8*3600)
	o := flashgate.Order{ID: 9, SaleID: "s", UserID: "u", Quantity: 1, Status: flashgate.OrderProcessing,
		IdemKey: "K", Charges: "0/sale/1/+8613800000001", Phone: "+8613800000001", Device: "d", IP: "10.0.0.1", Address: "ab",
		CreatedAt: time.Date(2026, 11, 24, 17, 30, 0, 0, cst), ExpiresAt: time.Date(2026, 11, 24, 17, 45, 0, 0, cst)}
	b, err := encodeOrderView(&o)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeOrderView(b)
	want := flashgate.Order{ID: 9, SaleID: "s", UserID: "u", Quantity: 1, Status: flashgate.OrderPending,
		CreatedAt: o.CreatedAt.UTC(), ExpiresAt: o.ExpiresAt.UTC()}
	if err != nil || got != want {
		t.Fatalf("decode(%s) = %+v, %v; want %+v", b, got, err, want)
	}
}

// The view's bytes are the API's: clients parse them.
func TestOrderViewGoldenBytes(t *testing.T) {
	o := flashgate.Order{ID: 7345119871795200001, SaleID: "sale-1", UserID: "user_42", Quantity: 2, Region: "bj",
		Status: flashgate.OrderCanceled, Reason: flashgate.ReasonExpired, IdemKey: "K-1", Phone: "+8613800000001",
		CreatedAt: time.UnixMilli(1767225600123), ExpiresAt: time.UnixMilli(1767226500123)}
	b, err := encodeOrderView(&o)
	want := `{"order_id":"7345119871795200001","sale_id":"sale-1","user_id":"user_42","quantity":2,"region":"bj",` +
		`"status":"canceled","reason":"expired","created_at":"2026-01-01T00:00:00.123Z","expires_at":"2026-01-01T00:15:00.123Z"}`
	if err != nil || string(b) != want {
		t.Fatalf("encodeOrderView\n got %s (%v)\nwant %s", b, err, want)
	}
}
