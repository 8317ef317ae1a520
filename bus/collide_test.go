package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/orderid"
)

// TestTwoGeneratorsOneNode: two id generators on one node id (a lease lost
// and taken over, a node id configured twice) make the same ids. Each
// gateway publishes its orders as a first publish (bus.SendNewOrder), of two
// different sales, on one stream: an answer of success must mean that order
// is in the stream, so no 202 is lost; the loser of each collision is told
// ErrDuplicate (the gateway releases it and answers 503).
func TestTwoGeneratorsOneNode(t *testing.T) {
	cfg := testenv.Config(t).NATS
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nc, _, stream := orderStream(ctx, t, cfg)
	at := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return at }
	gens := []*orderid.Generator{orderid.NewClock(7, clock), orderid.NewClock(7, clock)}
	sales := []string{"sa", "sb"}
	accepted := map[string][]uint64{}
	const n = 20
	refused := 0
	for i := range n {
		for g, gen := range gens {
			o := testOrder(gen.Next(), 1)
			o.SaleID, o.UserID = sales[g], "u"+sales[g]
			err := bus.SendNewOrder(ctx, nc, bus.OrderSubject(cfg, o.SaleID), &o, nil, "")
			switch {
			case err == nil:
				accepted[o.SaleID] = append(accepted[o.SaleID], o.ID)
			case errors.Is(err, bus.ErrDuplicate):
				refused++
			default:
				t.Fatalf("order %d of %s (round %d): %v", o.ID, o.SaleID, i, err)
			}
		}
	}
	if refused != n {
		t.Errorf("%d publishes refused as duplicates, want %d (every id was made twice)", refused, n)
	}
	// Every accepted order is in the stream, as itself.
	stored := map[uint64]flashgate.Order{}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		o, err := bus.DecodeOrder(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		stored[o.ID] = o
	}
	for sale, ids := range accepted {
		for _, id := range ids {
			if o, ok := stored[id]; !ok || o.SaleID != sale {
				t.Errorf("order %d of %s was accepted (a 202) and the stream holds %+v: a lost order", id, sale, o)
			}
		}
	}
	// The order's own copy sent again (a replay) is no duplicate error.
	for sale, ids := range accepted {
		o := stored[ids[0]]
		if err := bus.SendOrder(ctx, nc, bus.OrderSubject(cfg, sale), &o, nil, ""); err != nil {
			t.Errorf("a replay's publish of order %d: %v, want nil", o.ID, err)
		}
		break
	}
}
