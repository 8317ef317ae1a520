package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/testenv"
)

// TestPublishOrderDeduplicates: an order published twice (a replay, a
// republish by reconcile) is stored once, under its sale's subject, and the
// stored message decodes to the order.
func TestPublishOrderDeduplicates(t *testing.T) {
	cfg := testenv.Config(t).NATS
	js, err := jetstream.New(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := bus.EnsureStream(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	o := flashgate.Order{ID: 42, SaleID: "s1", UserID: "u1", Quantity: 2, Status: flashgate.OrderPending,
		CreatedAt: time.UnixMilli(1_700_000_000_000).UTC(), ExpiresAt: time.UnixMilli(1_700_000_900_000).UTC()}
	subject := bus.OrderSubject(cfg, o.SaleID)
	first, err := bus.PublishOrder(ctx, js, subject, &o, nil)
	if err != nil || first.Duplicate {
		t.Fatalf("first publish: %+v, %v", first, err)
	}
	again, err := bus.PublishOrder(ctx, js, subject, &o, make([]byte, 0, 8))
	if err != nil || !again.Duplicate || again.Sequence != first.Sequence {
		t.Fatalf("second publish: %+v, %v; want a duplicate of sequence %d", again, err, first.Sequence)
	}
	info, err := stream.Info(ctx)
	if err != nil || info.State.Msgs != 1 {
		t.Fatalf("stream holds %d messages (%v), want 1", info.State.Msgs, err)
	}
	m, err := stream.GetMsg(ctx, first.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	got, err := bus.DecodeOrder(m.Data)
	if err != nil || m.Subject != subject || got.ID != o.ID || got.UserID != o.UserID || got.Quantity != o.Quantity {
		t.Fatalf("stored %s %s: %+v, %v", m.Subject, m.Data, got, err)
	}
	if h := m.Header.Get(jetstream.MsgIDHeader); h != "42" {
		t.Fatalf("Nats-Msg-Id %q, want 42", h)
	}
}
