package mysql

import (
	"testing"
	"time"

	"github.com/flashgate/flashgate"
)

// TestOrderStatesOfOneSale: an order id is asked about for one sale. A row
// of another sale under that id (two id generators on one node) is not the
// asking order's: it answers OtherSale with no status, never the other
// order's status (which the writer would take for this order's outcome).
func TestOrderStatesOfOneSale(t *testing.T) {
	db, s := migrated(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	o := flashgate.Order{ID: 4242, SaleID: s.ID, UserID: "u1", Quantity: 1, Region: "a", Status: flashgate.OrderFailed, Reason: flashgate.ReasonSoldOut, CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
	if ok, err := InsertFailed(ctx(t), db, o, now); err != nil || !ok {
		t.Fatalf("insert: %v %v", ok, err)
	}
	own, err := OrderStates(ctx(t), db, s.ID, []uint64{4242, 4343})
	if err != nil {
		t.Fatal(err)
	}
	if st, ok := own[4242]; !ok || st.OtherSale || st.Status != flashgate.OrderFailed {
		t.Fatalf("own sale: %+v %v, want the row's failed status", st, ok)
	}
	if _, ok := own[4343]; ok {
		t.Fatal("an id MySQL lacks answered")
	}
	other, err := OrderStates(ctx(t), db, "another-sale", []uint64{4242})
	if err != nil {
		t.Fatal(err)
	}
	if st, ok := other[4242]; !ok || !st.OtherSale || st.Status != "" {
		t.Fatalf("another sale asking for the id: %+v %v, want OtherSale and no status", st, ok)
	}
	if st, err := OrderStateOf(ctx(t), db, s.ID, 4242); err != nil || st.OtherSale || st.Status != flashgate.OrderFailed {
		t.Fatalf("OrderStateOf, own sale: %+v %v", st, err)
	}
	if st, err := OrderStateOf(ctx(t), db, "another-sale", 4242); err != nil || !st.OtherSale || st.Status != "" {
		t.Fatalf("OrderStateOf, another sale: %+v %v, want OtherSale", st, err)
	}
}
