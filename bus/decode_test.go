package bus

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
)

func validSale() *flashgate.Sale {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return &flashgate.Sale{ID: "s1", Title: "t", PriceCents: 1, Total: 10, StartsAt: t0, EndsAt: t0.Add(time.Hour),
		PerUserLimit: 2, PerOrderMax: 1}
}

func TestDecodeEvent(t *testing.T) {
	enc := func(ev SaleEvent) []byte { b, _ := json.Marshal(ev); return b }
	bad := validSale()
	bad.PerOrderMax = 0
	other := validSale()
	other.ID = "s2"
	for _, c := range []struct {
		name string
		in   []byte
		ok   bool
	}{
		{"closed", enc(SaleEvent{Type: EventClosed, SaleID: "s1"}), true},
		{"created", enc(SaleEvent{Type: EventCreated, SaleID: "s1", Sale: validSale()}), true},
		{"sold out of a region", enc(SaleEvent{Type: EventSoldOut, SaleID: "s1", Region: "bj"}), true},
		{"warm", enc(SaleEvent{Type: EventWarm, SaleID: "s1"}), true},
		{"created without a sale", enc(SaleEvent{Type: EventCreated, SaleID: "s1"}), false},
		{"created, another sale", enc(SaleEvent{Type: EventCreated, SaleID: "s1", Sale: other}), false},
		{"created, invalid sale", enc(SaleEvent{Type: EventCreated, SaleID: "s1", Sale: bad}), false},
		{"unknown type (the subscriber ignores it)", enc(SaleEvent{Type: "opened", SaleID: "s1"}), true},
		{"bad sale id", enc(SaleEvent{Type: EventClosed, SaleID: "a b"}), false},
		{"not json", []byte("{"), false},
		{"null", []byte("null"), false},
	} {
		if _, ok := DecodeEvent(c.in); ok != c.ok {
			t.Errorf("%s: ok %v, want %v", c.name, ok, c.ok)
		}
	}
}

// FuzzDecodeEvent: never panics; what it accepts names a valid sale id, and a
// created event carries a valid sale of that id.
func FuzzDecodeEvent(f *testing.F) {
	for _, ev := range []SaleEvent{{Type: EventClosed, SaleID: "s1"}, {Type: EventCreated, SaleID: "s1", Sale: validSale()},
		{Type: EventSoldOut, SaleID: "s1", Region: "bj"}} {
		b, _ := json.Marshal(ev)
		f.Add(b)
	}
	f.Add([]byte(`{"type":"created","sale_id":"s1","sale":{"id":"s1","regions":{"bj":-1}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, ok := DecodeEvent(b)
		if !ok {
			return
		}
		if !flashgate.ValidID(ev.SaleID) {
			t.Fatalf("%q: accepted sale id %q", b, ev.SaleID)
		}
		if ev.Type == EventCreated && (ev.Sale == nil || ev.Sale.ID != ev.SaleID || ev.Sale.Validate() != nil) {
			t.Fatalf("%q: accepted a created event with sale %+v", b, ev.Sale)
		}
	})
}

// FuzzDecodeCommand: never panics; what it accepts is a well-formed command
// that survives a round trip.
func FuzzDecodeCommand(f *testing.F) {
	for _, c := range []OrderCommand{PayCommand(flashgate.Payment{SaleID: "s", OrderID: 7, PaymentID: "pi_1", AmountCents: 100}),
		{Op: CmdCancel, SaleID: "s", OrderID: 1<<64 - 1, UserID: "u"}} {
		b, _ := json.Marshal(c)
		f.Add(b)
	}
	f.Add([]byte(`{"op":"pay","sale_id":"s","order_id":7,"user_id":"u"}`))
	f.Add([]byte(`{"op":"pay","sale_id":"s","order_id":"7","user_id":"u","payment_id":"p","amount_cents":1}`))
	f.Add([]byte(`{"op":"refund","sale_id":"s","order_id":"7","user_id":"u"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, ok := DecodeCommand(b)
		if !ok {
			return
		}
		p := c.Payment()
		switch {
		case c.OrderID == 0 || !flashgate.ValidID(c.SaleID),
			c.Op == CmdPay && (c.UserID != "" || p.Validate() != nil),
			c.Op != CmdPay && (!flashgate.ValidID(c.UserID) || c.PaymentID != "" || c.AmountCents != 0),
			c.Op != CmdPay && c.Op != CmdCancel && c.Op != CmdGet:
			t.Fatalf("%q: accepted %+v", b, c)
		}
		out, _ := json.Marshal(c)
		if again, ok := DecodeCommand(out); !ok || again != c {
			t.Fatalf("%q: %+v does not round-trip: %+v %v", b, c, again, ok)
		}
	})
}
