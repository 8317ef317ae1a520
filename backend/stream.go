package backend

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
)

// orderStream reads a sale's messages in the orders stream: how many, and
// which orders. Reconcile, the warmer's in-flight count and retention read it.
type orderStream struct {
	js   jetstream.JetStream
	nats config.NATS
}

// streamCount is how many messages of sale the orders stream holds: under
// work-queue retention, those not yet acked.
func (q *orderStream) streamCount(ctx context.Context, sale string) (uint64, error) {
	_, n, _, err := q.streamState(ctx, sale)
	return n, err
}

func (q *orderStream) streamState(ctx context.Context, sale string) (jetstream.Stream, uint64, jetstream.StreamState, error) {
	s, err := q.js.Stream(ctx, q.nats.Stream)
	if err != nil {
		return nil, 0, jetstream.StreamState{}, fmt.Errorf("stream %s: %w", q.nats.Stream, err)
	}
	subject := bus.OrderSubject(q.nats, sale)
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return nil, 0, jetstream.StreamState{}, fmt.Errorf("stream %s: %w", q.nats.Stream, err)
	}
	return s, info.State.Subjects[subject], info.State, nil
}

// streamOrders reads the sale's order messages still in the orders stream, by
// order id, without consuming them: STREAM.MSG.GET next_by_subj, one message
// per request, up to the stream's last sequence when it began (later messages
// are admissions Redis knows). Undecodable messages are skipped (the consumer
// dead-letters them).
func (q *orderStream) streamOrders(ctx context.Context, sale string) (map[uint64]flashgate.Order, error) {
	s, n, st, err := q.streamState(ctx, sale)
	if err != nil || n == 0 {
		return nil, err
	}
	subject := bus.OrderSubject(q.nats, sale)
	out := make(map[uint64]flashgate.Order, n)
	for seq := st.FirstSeq; seq <= st.LastSeq; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("stream %s: reading %s: %w", q.nats.Stream, subject, err)
		}
		if o, err := bus.DecodeOrder(m.Data); err == nil && o.SaleID == sale {
			if _, dup := out[o.ID]; !dup {
				out[o.ID] = o
			}
		}
		seq = m.Sequence + 1
	}
	return out, nil
}
