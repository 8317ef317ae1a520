package chaos

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate/internal/eventcheck"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/mysql"
)

// eventsWait bounds the wait for the leader to publish the whole outbox
// once the sale settled (a killed leader's successor takes the lock within
// its validity, then publishes).
const eventsWait = 60 * time.Second

// checkEvents reads the order-events stream of sale as a downstream consumer
// would (deduping on the event id) once the outbox is drained, and requires
// exactly one event per change MySQL made, in order per order, each passing
// the AsyncAPI schema (docs/events.md). It logs what the consumer counted.
func (st *stack) checkEvents(scenario, sale string) {
	t := st.t
	t.Helper()
	db, err := mysql.OpenDB(st.cfg.MySQL.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	deadline := time.Now().Add(eventsWait)
	for {
		ok, err := eventcheck.Drained(context.Background(), db)
		if err == nil && ok {
			break
		}
		if time.Now().After(deadline) {
			n, _, _ := mysql.EventBacklog(context.Background(), db)
			t.Errorf("%s: the outbox still holds %d events after %v (%v)", scenario, n, eventsWait, err)
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	nc, err := nats.Connect(st.cfg.NATS.URL, testenv.NATSOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	validate, err := eventcheck.SchemaValidator()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := eventcheck.Check(ctx, js, st.cfg.Events, db, sale, validate)
	if err != nil {
		t.Fatalf("%s: order events: %v", scenario, err)
	}
	t.Logf("%s: order events: %s", scenario, rep)
	if !rep.OK() || rep.Changes == 0 {
		t.Errorf("%s: the consumer did not see exactly one event per change: %s; %v", scenario, rep, rep.Problems)
	}
}
