// Package eventcheck is the tests' consumer of the order-events stream
// (docs/events.md): it reads every event of a sale as a downstream consumer
// would, dedupes them on their event id, and holds them against MySQL's
// orders: exactly one event per change, in order per order.
package eventcheck

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/mysql"
)

// Report is what a consumer of one sale's events saw.
type Report struct {
	// Messages is every message of the sale in the stream; Unique the
	// distinct event ids among them; Duplicates the rest (a consumer drops
	// them by event id).
	Messages, Unique, Duplicates int
	// Changes is what MySQL's orders say happened: the sum of their event
	// seqs (every change raised its order's seq once).
	Changes int
	// Missing: changes with no event; Unexpected: events of no change
	// (an order MySQL lacks, or a seq past its last); OutOfOrder: an event
	// stored after a later one of its order; Stale: an order whose last event
	// does not carry its status and reason now; Invalid: messages that did
	// not decode or whose schema check failed.
	Missing, Unexpected, OutOfOrder, Stale, Invalid int
	// Types counts the unique events by type.
	Types map[flashgate.EventType]int
	// Problems names the first few faults.
	Problems []string
}

// OK reports whether the consumer saw exactly one event per change, in order.
func (r Report) OK() bool {
	return r.Missing == 0 && r.Unexpected == 0 && r.OutOfOrder == 0 && r.Stale == 0 && r.Invalid == 0 && r.Unique == r.Changes
}

func (r Report) String() string {
	return fmt.Sprintf("messages %d, unique %d, duplicates dropped %d, changes in MySQL %d, missing %d, unexpected %d, out of order %d, stale %d, invalid %d, types %v",
		r.Messages, r.Unique, r.Duplicates, r.Changes, r.Missing, r.Unexpected, r.OutOfOrder, r.Stale, r.Invalid, r.Types)
}

func (r *Report) problem(format string, args ...any) {
	if len(r.Problems) < 10 {
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
	}
}

// Drained reports whether the outbox is empty: every event written is in
// the stream.
func Drained(ctx context.Context, db *sql.DB) (bool, error) {
	n, _, err := mysql.EventBacklog(ctx, db)
	return n == 0, err
}

// Check reads every event of sale in the stream (an ordered consumer, as a
// downstream one would use) and holds them against MySQL. validate, if not
// nil, checks each message body (the AsyncAPI schema).
func Check(ctx context.Context, js jetstream.JetStream, cfg config.Events, db *sql.DB, sale string, validate func([]byte) error) (Report, error) {
	r := Report{Types: map[flashgate.EventType]int{}}
	subject := bus.OrderEventSubject(cfg, sale)
	s, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		return r, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return r, err
	}
	want := int(info.State.Subjects[subject])
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		return r, err
	}
	seen := map[string]bool{}
	last := map[uint64]uint32{}                 // per order, the last seq seen
	latest := map[uint64]flashgate.OrderEvent{} // per order, its event of that seq
	for r.Messages < want {
		batch, err := cons.Fetch(min(want-r.Messages, 1000), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return r, err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			r.Messages++
			body := m.Data()
			if validate != nil {
				if err := validate(body); err != nil {
					r.Invalid++
					r.problem("schema: %v", err)
				}
			}
			ev, err := bus.DecodeOrderEvent(body)
			if err != nil || ev.ID == "" || m.Headers().Get(jetstream.MsgIDHeader) != ev.ID {
				r.Invalid++
				r.problem("message %q: %v", body, err)
				continue
			}
			if seen[ev.ID] {
				r.Duplicates++
				continue
			}
			seen[ev.ID] = true
			r.Unique++
			r.Types[ev.Type]++
			if ev.Seq != last[ev.OrderID]+1 {
				r.OutOfOrder++
				r.problem("order %d: event seq %d after %d", ev.OrderID, ev.Seq, last[ev.OrderID])
			}
			if ev.Seq > last[ev.OrderID] {
				last[ev.OrderID], latest[ev.OrderID] = ev.Seq, ev
			}
		}
		if err := batch.Error(); err != nil {
			return r, err
		}
		if got == 0 {
			return r, fmt.Errorf("stream %s: %d of %d messages of %s read, then none", cfg.Stream, r.Messages, want, subject)
		}
	}
	hist, err := mysql.OrderHistories(ctx, db, sale)
	if err != nil {
		return r, err
	}
	for id, h := range hist {
		r.Changes += int(h.Seq)
		for seq := uint32(1); seq <= h.Seq; seq++ {
			if !seen[fmt.Sprintf("%d-%d", id, seq)] {
				r.Missing++
				r.problem("order %d: no event of change %d", id, seq)
			}
		}
	}
	for id, seq := range last {
		if h, ok := hist[id]; !ok || seq > h.Seq {
			r.Unexpected++
			r.problem("order %d: an event %d MySQL has no change for", id, seq)
		}
	}
	// The last event of each order carries the order as it now stands.
	for id, h := range hist {
		if ev, ok := latest[id]; ok && ev.Seq == h.Seq && (ev.Status != h.Status || ev.Reason != h.Reason) {
			r.Stale++
			r.problem("order %d: last event %s/%s, MySQL %s/%s", id, ev.Status, ev.Reason, h.Status, h.Reason)
		}
	}
	return r, nil
}
