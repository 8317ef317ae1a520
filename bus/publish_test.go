package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
)

// TestPublishOrderDeduplicates: an order published twice (a replay, a
// republish by reconcile) is stored once, under its sale's subject, and the
// stored message decodes to the order.
func TestPublishOrderDeduplicates(t *testing.T) {
	cfg := testenv.Config(t).NATS
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, js, stream := orderStream(ctx, t, cfg)
	o := testOrder(42, 2)
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

// TestSendOrder: the gateway's publish stores the order once with both headers
// (its id for deduplication, the request id), answers nil for a duplicate,
// the stream's own error when it refuses (full, discard new), and
// ErrNoStreamResponse when no stream takes the subject within its budget.
func TestSendOrder(t *testing.T) {
	cfg := testenv.Config(t).NATS
	cfg.MaxStreamMsgs = 2
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, _, stream := orderStream(ctx, t, cfg)
	o := testOrder(7, 1)
	subject := bus.OrderSubject(cfg, o.SaleID)
	for range 2 {
		if err := bus.SendOrder(ctx, nc, subject, &o, make([]byte, 0, 8), "req-1"); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	info, err := stream.Info(ctx)
	if err != nil || info.State.Msgs != 1 {
		t.Fatalf("stream holds %d messages (%v) after the same order twice, want 1", info.State.Msgs, err)
	}
	m, err := stream.GetMsg(ctx, info.State.LastSeq)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := bus.DecodeOrder(m.Data); err != nil || got.ID != o.ID || m.Header.Get(jetstream.MsgIDHeader) != "7" || m.Header.Get(bus.HeaderRequestID) != "req-1" {
		t.Fatalf("stored %s %v: %+v, %v", m.Data, m.Header, got, err)
	}
	// Full: the second order fits, the third is refused by the stream.
	o.ID = 8
	if err := bus.SendOrder(ctx, nc, subject, &o, nil, ""); err != nil {
		t.Fatalf("send a second order: %v", err)
	}
	o.ID = 9
	err = bus.SendOrder(ctx, nc, subject, &o, nil, "")
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.Code == 0 {
		t.Fatalf("send to a full stream: %v, want the stream's API error", err)
	}
	// No stream for the subject: asked again until the budget is spent.
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if err := bus.SendOrder(short, nc, "no-stream-here."+testenv.ID("x"), &o, nil, ""); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("send where no stream listens: %v, want ErrNoStreamResponse", err)
	}
}

// orderStream is the test's orders stream on the test's NATS, with the
// connection and its JetStream.
func orderStream(ctx context.Context, t *testing.T, cfg config.NATS) (*nats.Conn, jetstream.JetStream, jetstream.Stream) {
	t.Helper()
	nc := testenv.NATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := bus.EnsureStream(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, stream
}

// testOrder is a pending order of sale s1 by u1.
func testOrder(id uint64, qty int64) flashgate.Order {
	return flashgate.Order{ID: id, SaleID: "s1", UserID: "u1", Quantity: qty, Status: flashgate.OrderPending,
		CreatedAt: time.UnixMilli(1_700_000_000_000).UTC(), ExpiresAt: time.UnixMilli(1_700_000_900_000).UTC()}
}
