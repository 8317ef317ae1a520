package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/authstack"
	"github.com/flashgate/flashgate/internal/testenv"
)

// TestLanePermissions: under the stack's NATS users, a gateway may send a
// lane purchase (docs/degrade.md) and an order command, and a backend may
// answer both, with no permission error on either side; the answers come back
// under bus.ReplyPrefix. A backend cannot publish on a gateway's _INBOX, where
// the JetStream publish acks arrive (it has no allow_responses, docs/credentials.md).
func TestLanePermissions(t *testing.T) {
	st := authstack.Start(t)
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
	cmds, err := bus.ServeCommands(backend, cfg, func(c bus.OrderCommand) bus.OrderReply {
		return bus.OrderReply{Code: bus.ReplyOK, Status: string(flashgate.OrderPaid)}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cmds.Unsubscribe()
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
	cr, err := bus.Command(ctx, gateway, st.Config(config.Default(), st.Gateway).NATS,
		bus.PayCommand(flashgate.Payment{SaleID: o.SaleID, OrderID: 7, PaymentID: "pi_7", AmountCents: 100}))
	if err != nil || cr.Code != bus.ReplyOK || cr.Status != string(flashgate.OrderPaid) {
		t.Fatalf("order command as the gateway: %+v, %v", cr, err)
	}
	select {
	case err := <-errs:
		t.Fatalf("permission error: %v", err)
	case <-time.After(200 * time.Millisecond):
	}

	// A backend answering on an _INBOX (a forged publish ack) is refused.
	if err := backend.Publish("_INBOX.forged", []byte(`{"stream":"x","seq":1}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("backend publishing on an _INBOX: %v, want a permissions violation", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server took a publish on an _INBOX from a backend's credentials")
	}
}
