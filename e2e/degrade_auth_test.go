package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
)

// TestLanePermissions: under the stack's NATS users, a gateway may send a
// lane purchase and a backend may answer it (docs/degrade.md), with no
// permission error on either side.
func TestLanePermissions(t *testing.T) {
	st := testenv.StartAuthStack(t)
	cfg := st.Config(config.Default(), st.Backend).NATS
	errs := make(chan error, 10)
	backend := connectAs(t, st.NATS.URL(), st.Backend, errs)
	sub, err := bus.ServePurchases(backend, cfg, func(p bus.LanePurchase) bus.LaneReply {
		return bus.LaneReply{Outcome: string(flashgate.LaneSoldOut)}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := backend.Flush(); err != nil {
		t.Fatal(err)
	}
	gateway := connectAs(t, st.NATS.URL(), st.Gateway, errs)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now := time.Now()
	o := flashgate.Order{SaleID: testenv.ID("lane"), UserID: "u1", Quantity: 1, CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
	r, err := bus.Purchase(ctx, gateway, st.Config(config.Default(), st.Gateway).NATS, bus.PurchaseOf(&o))
	if err != nil || r.Outcome != string(flashgate.LaneSoldOut) {
		t.Fatalf("lane purchase as the gateway: %+v, %v", r, err)
	}
	select {
	case err := <-errs:
		t.Fatalf("permission error: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
}
