package bus

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
)

// A reply carries the order a command left, over NATS, as JSON.
func TestReplyOrderRoundTrip(t *testing.T) {
	at := time.Date(2026, 11, 24, 9, 30, 0, 123000000, time.UTC)
	for _, o := range []flashgate.Order{
		{ID: 1, SaleID: "s", UserID: "u", Quantity: 1, Status: flashgate.OrderPaid, CreatedAt: at, ExpiresAt: at.Add(15 * time.Minute)},
		{ID: 7345119871795200001, SaleID: "sale-1", UserID: "user_42", Quantity: 2, Region: "bj", Status: flashgate.OrderCanceled,
			Reason: flashgate.ReasonExpired, CreatedAt: at, ExpiresAt: at},
		{ID: 3, SaleID: "s", UserID: "u", Quantity: 1, Status: flashgate.OrderFailed, Reason: flashgate.LimitReason(flashgate.DimIP),
			CreatedAt: at.In(time.FixedZone("CST", 8*3600)), ExpiresAt: at},
	} {
		b, err := json.Marshal(ReplyOf(ReplyOK, "", &o))
		if err != nil {
			t.Fatal(err)
		}
		var r OrderReply
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		want := o
		want.CreatedAt, want.ExpiresAt = o.CreatedAt.UTC(), o.ExpiresAt.UTC()
		if got := r.Order(o.SaleID, o.ID, o.UserID); r.Code != ReplyOK || got != want {
			t.Errorf("reply %s: %+v, want %+v", b, got, want)
		}
	}
}

// The reply's bytes are what gateways of other builds parse.
func TestReplyGoldenBytes(t *testing.T) {
	o := flashgate.Order{ID: 9, SaleID: "s", UserID: "u", Quantity: 2, Region: "bj", Status: flashgate.OrderCanceled,
		Reason: flashgate.ReasonCanceled, IdemKey: "K", Charges: "0/sale/2/u", Phone: "+1",
		CreatedAt: time.UnixMilli(1767225600000).UTC(), ExpiresAt: time.UnixMilli(1767226500000).UTC()}
	b, err := json.Marshal(ReplyOf(ReplyOK, "", &o))
	want := `{"code":"ok","status":"canceled","reason":"canceled","quantity":2,"region":"bj",` +
		`"created_at":"2026-01-01T00:00:00Z","expires_at":"2026-01-01T00:15:00Z"}`
	if err != nil || string(b) != want {
		t.Fatalf("reply\n got %s (%v)\nwant %s", b, err, want)
	}
}
