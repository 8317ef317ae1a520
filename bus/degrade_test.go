package bus

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
)

// A lane purchase survives the wire with the buyer's facts and no id; what a
// backend must not act on is refused.
func TestLanePurchaseWire(t *testing.T) {
	now := time.UnixMilli(time.Now().UnixMilli()).UTC()
	o := flashgate.Order{ID: 99, SaleID: "s1", UserID: "u1", Quantity: 2, Region: "bj", IdemKey: "k-1",
		Phone: "+8613800000000", Device: "dev1", IP: "203.0.113.7", Address: "abcdef0123456789",
		CreatedAt: now, ExpiresAt: now.Add(15 * time.Minute)}
	b, err := json.Marshal(PurchaseOf(&o))
	if err != nil {
		t.Fatal(err)
	}
	p, ok := DecodePurchase(b)
	if !ok {
		t.Fatalf("%s does not decode", b)
	}
	want := o
	want.ID = 0 // the lane makes the id
	if got := p.Order(); got != want {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, want)
	}
	bad := map[string]func(*LanePurchase){
		"sale id":        func(p *LanePurchase) { p.SaleID = "a b" },
		"user id":        func(p *LanePurchase) { p.UserID = "" },
		"no time":        func(p *LanePurchase) { p.CreatedMS = 0 },
		"expires before": func(p *LanePurchase) { p.ExpiresMS = p.CreatedMS - 1 },
		"idem key":       func(p *LanePurchase) { p.IdemKey = "k|1" },
		"region":         func(p *LanePurchase) { p.Region = "BJ!" },
		"phone":          func(p *LanePurchase) { p.Phone = "+86,1" },
	}
	for name, spoil := range bad {
		q := PurchaseOf(&o)
		spoil(&q)
		b, _ := json.Marshal(q)
		if _, ok := DecodePurchase(b); ok {
			t.Errorf("%s: %s decodes", name, b)
		}
	}
	if _, ok := DecodePurchase([]byte("{")); ok {
		t.Error("broken JSON decodes")
	}
}
