package lua_test

import (
	"strings"
	"testing"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/lua"
)

func TestRecordRoundTrip(t *testing.T) {
	long := strings.Repeat("z", 64)
	for _, o := range []flashgate.Order{
		{ID: 1, SaleID: "s", UserID: "u", Quantity: 1, Status: flashgate.OrderPending, CreatedAt: ms(1767225600000), ExpiresAt: ms(1767226500000)},
		{ID: 7345119871795200001, SaleID: "sale-1", UserID: "user_42", Quantity: 2, Region: "bj", Status: flashgate.OrderConfirmed,
			IdemKey: "K-1_a", Charges: "0/d20261124/1/+8613800000001,1/sale/2/2001:db8::/64", CreatedAt: ms(1767225600123), ExpiresAt: ms(1767226500123)},
		{ID: 1<<64 - 1, SaleID: long, UserID: long, Quantity: flashgate.MaxSaleUnits, Region: "abcdefghijklmnop", IdemKey: long,
			Status: flashgate.OrderProcessing, CreatedAt: ms(-1), ExpiresAt: ms(1 << 50)},
		{ID: 3, SaleID: "s", UserID: "u", Quantity: 1, Status: flashgate.OrderFailed, Reason: flashgate.LimitReason(flashgate.DimAddress),
			Charges: "4/sale/1/0123456789abcdef", CreatedAt: ms(5), ExpiresAt: ms(6)},
		{ID: 4, SaleID: "s", UserID: "u", Quantity: 3, Status: flashgate.OrderCanceled, Reason: flashgate.ReasonExpired, CreatedAt: ms(5), ExpiresAt: ms(6)},
		{ID: 5, SaleID: "s", UserID: "u", Quantity: 3, Status: flashgate.OrderReleased, Reason: flashgate.ReasonPublishFailed, CreatedAt: ms(5), ExpiresAt: ms(6)},
	} {
		v := lua.EncodeRecord(&o)
		got, err := lua.DecodeRecord(o.SaleID, o.ID, v)
		if err != nil || got != o {
			t.Errorf("record %q: %+v, %v; want %+v", v, got, err, o)
		}
		// The reservation is the same order, pending and without a reason.
		pending := o
		pending.Status, pending.Reason = flashgate.OrderPending, ""
		if got, err := lua.DecodeResv(o.SaleID, o.ID, lua.EncodeResv(&o)); err != nil || got != pending {
			t.Errorf("resv of %+v: %+v, %v", o, got, err)
		}
	}
}

// The record's bytes are what the scripts parse and what Redis already holds.
func TestRecordGoldenBytes(t *testing.T) {
	o := flashgate.Order{ID: 7345119871795200001, SaleID: "sale-1", UserID: "user_42", Quantity: 2, Region: "bj",
		Status: flashgate.OrderFailed, Reason: flashgate.ReasonSoldOut, IdemKey: "K-1", Charges: "0/sale/2/user_42",
		Phone: "+8613800000001", IP: "10.0.0.1", // not in the record
		CreatedAt: ms(1767225600000), ExpiresAt: ms(1767226500000)}
	if got, want := lua.EncodeRecord(&o), "failed|sold_out|user_42|2|bj|1767225600000|1767226500000|K-1|0/sale/2/user_42"; got != want {
		t.Errorf("EncodeRecord = %q, want %q", got, want)
	}
	if got, want := lua.EncodeResv(&o), "user_42|2|bj|1767225600000|1767226500000|K-1|0/sale/2/user_42"; got != want {
		t.Errorf("EncodeResv = %q, want %q", got, want)
	}
	// An order built without times writes 0, as records always had.
	if got, want := lua.EncodeRecord(&flashgate.Order{UserID: "u", Quantity: 1, Status: flashgate.OrderConfirmed}), "confirmed||u|1||0|0||"; got != want {
		t.Errorf("EncodeRecord without times = %q, want %q", got, want)
	}
	// A record from before charges existed has eight fields.
	if got, err := lua.DecodeRecord("s", 1, "paid||u|1||1000|2000|"); err != nil || got.Status != flashgate.OrderPaid || got.Charges != "" || got.ExpiresAt != ms(2000) {
		t.Errorf("eight fields: %+v, %v", got, err)
	}
}
