package backend

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/eventcheck"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics"
	"github.com/flashgate/flashgate/mysql"
)

// everyChange makes one sale's orders go through every status change the
// code makes, each by its own path: the batch writer's fast path and its
// fallback (confirmed, and failed sold_out where Redis over-admitted), pay,
// cancel, the expiry sweep, the dead-letter path and the degraded lane. It
// answers the sale and how many changes it made. fault, if not nil, runs
// between the steps: after the first batch (1), the second (2), and the
// payments and cancels (3).
func everyChange(t *testing.T, e *env, fault func(step int)) (*flashgate.Sale, int) {
	t.Helper()
	sale := spec(30, 1, nil)
	if err := insertSale(ctx(t), e.db, sale, sale.StartsAt); err != nil {
		t.Fatal(err)
	}
	k := e.warmWith(sale, map[string]int64{"": 45})
	var orders []flashgate.Order
	for i := range 40 {
		orders = append(orders, admit(t, e.rc, k, "u"+strconv.Itoa(i), 1, ""))
	}
	changes := 0
	if fault == nil {
		fault = func(int) {}
	}
	for i, part := range [][]flashgate.Order{orders[:20], orders[20:]} { // the second batch overflows: fallback
		for _, o := range e.process(sale.ID, part) {
			if o.Status != flashgate.OrderConfirmed && o.Status != flashgate.OrderFailed {
				t.Fatalf("order %d: %+v", o.ID, o)
			}
			changes++
		}
		fault(i + 1)
	}
	if got := e.rows(sale.ID, "confirmed"); got != 30 {
		t.Fatalf("%d confirmed, want 30", got)
	}
	life := &lifecycle{db: e.db, rc: e.rc, nats: e.cfg.NATS, scripts: e.scripts, log: quiet,
		events: &saleEvents{nc: testenv.NATS(t), cfg: e.cfg.NATS, log: quiet}, procCtx: context.Background()}
	var confirmed []flashgate.Order
	for _, o := range orders {
		if st, _, _ := e.order(o.ID); st == "confirmed" {
			confirmed = append(confirmed, o)
		}
	}
	cmd := func(op string, o flashgate.Order) bus.OrderCommand {
		return bus.OrderCommand{Op: op, SaleID: sale.ID, OrderID: o.ID, UserID: o.UserID}
	}
	for _, o := range confirmed[:5] {
		pay := bus.PayCommand(flashgate.Payment{OrderID: o.ID, SaleID: sale.ID, PaymentID: fmt.Sprintf("pay-%d", o.ID), AmountCents: sale.PriceCents * o.Quantity})
		if r, err := life.pay(ctx(t), pay); err != nil || r.Status != "paid" {
			t.Fatalf("pay %d: %+v %v", o.ID, r, err)
		}
		// Paying again changes nothing, and writes no event.
		if r, err := life.pay(ctx(t), pay); err != nil || r.Status != "paid" {
			t.Fatalf("pay %d again: %+v %v", o.ID, r, err)
		}
		changes++
	}
	for _, o := range confirmed[5:10] {
		for range 2 { // the second cancel changes nothing
			if r, err := life.cancel(ctx(t), cmd(bus.CmdCancel, o), time.Now()); err != nil || r.Status != "canceled" {
				t.Fatalf("cancel %d: %+v %v", o.ID, r, err)
			}
		}
		changes++
	}
	fault(3)
	if n, err := life.expireOrders(ctx(t), sale.ID, ids(confirmed[10:15]), time.Now().Add(time.Hour)); err != nil || n != 5 {
		t.Fatalf("expired %d: %v", n, err)
	}
	changes += 5
	dead := admit(t, e.rc, k, "dead", 1, "")
	for range 2 { // a second dead-lettering of it writes nothing
		if _, _, err := failOrderRow(ctx(t), e.db, dead, ReasonDeadLetter, time.Now().UTC()); err != nil {
			t.Fatal(err)
		}
	}
	changes++
	next := nextID.Add(1000)
	r, err := mysql.DecideDegraded(ctx(t), e.db, mysql.LanePurchase{Order: flashgate.Order{SaleID: sale.ID, UserID: "lane",
		Quantity: 1, CreatedAt: time.Now().UTC(), ExpiresAt: time.Now().UTC().Add(time.Minute)},
		NextID: func() uint64 { return next }}, time.Now())
	if err != nil || r.Outcome != flashgate.LaneAdmitted {
		t.Fatalf("lane: %+v %v", r, err)
	}
	changes++
	return sale, changes
}

// The publisher "crashes" after JetStream acked a pass's events and before
// it deleted their rows; a new publisher publishes them again. A consumer
// still sees exactly one event per change, in order per order: the stream
// drops the republished copies (Nats-Msg-Id = event id). Every event passes
// the AsyncAPI schema.
func TestOrderEventsOnceAcrossPublisherCrash(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.RedisAddrs())
	js, err := jetstream.New(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bus.EnsureOrderEventStream(ctx(t), js, e.cfg.Events, 1); err != nil {
		t.Fatal(err)
	}
	sale, changes := everyChange(t, e, nil)
	backlog, _, err := mysql.EventBacklog(ctx(t), e.db)
	if err != nil || backlog != int64(changes) {
		t.Fatalf("outbox holds %d events (%v), want one per change: %d", backlog, err, changes)
	}

	crash := errors.New("killed after the acks, before the delete")
	var firstAcked int
	p1 := &eventPublisher{db: e.db, js: js, cfg: e.cfg.Events, log: quiet, metrics: newEventMetrics(metrics.NewBackend().Registry()),
		acked: func(n int) error { firstAcked = n; return crash }}
	if _, err := p1.pass(ctx(t)); !errors.Is(err, crash) {
		t.Fatalf("first pass: %v", err)
	}
	if after, _, _ := mysql.EventBacklog(ctx(t), e.db); after != backlog || firstAcked == 0 {
		t.Fatalf("after the crash: outbox %d (want %d), %d acked", after, backlog, firstAcked)
	}

	p2 := &eventPublisher{db: e.db, js: js, cfg: e.cfg.Events, log: quiet, metrics: newEventMetrics(metrics.NewBackend().Registry())}
	passes := 0
	for {
		n, err := p2.pass(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		passes++
	}
	// An order's second event waits for the pass after its first.
	if passes < 2 {
		t.Errorf("%d passes drained the outbox: an order's two events went in one", passes)
	}
	validate, err := eventcheck.SchemaValidator()
	if err != nil {
		t.Fatal(err)
	}
	rep, err := eventcheck.Check(ctx(t), js, e.cfg.Events, e.db, sale.ID, validate)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("republished after the crash: %d; consumer: %s", firstAcked, rep)
	if !rep.OK() || rep.Changes != changes || rep.Duplicates != 0 {
		t.Fatalf("consumer saw %s; problems %v", rep, rep.Problems)
	}
	for typ, want := range map[flashgate.EventType]int{flashgate.EventConfirmed: 31, flashgate.EventFailed: 11,
		flashgate.EventPaid: 5, flashgate.EventCanceled: 5, flashgate.EventExpired: 5} {
		if rep.Types[typ] != want {
			t.Errorf("%d %s events, want %d", rep.Types[typ], typ, want)
		}
	}
}

// A running backend's leader publishes the events of what it writes (the
// consumer's batches, a payment), and its /metrics shows the publisher's
// work and an empty backlog once drained.
func TestOrderEventsFromARunningBackend(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	sale := spec(10, 1, nil)
	k := s.createSale(sale)
	var orders []flashgate.Order
	for i := range 10 {
		o := admit(t, s.rc, k, "u"+strconv.Itoa(i), 1, "")
		s.publish(o)
		orders = append(orders, o)
	}
	eventually(t, 10*time.Second, "10 confirmed rows", func() bool { return s.rows(sale.ID, "confirmed") == 10 })
	if r := s.command(bus.CmdPay, orders[0], orders[0].UserID); r.Status != "paid" {
		t.Fatalf("pay: %+v", r)
	}
	eventually(t, 10*time.Second, "the outbox drained", func() bool {
		ok, err := eventcheck.Drained(ctx(t), s.db)
		return err == nil && ok
	})
	validate, err := eventcheck.SchemaValidator()
	if err != nil {
		t.Fatal(err)
	}
	rep, err := eventcheck.Check(ctx(t), s.js, s.cfg.Events, s.db, sale.ID, validate)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("consumer: %s", rep)
	if !rep.OK() || rep.Changes != 11 || rep.Types[flashgate.EventPaid] != 1 {
		t.Fatalf("consumer saw %s; problems %v", rep, rep.Problems)
	}
	eventually(t, 10*time.Second, "the publisher's metrics", func() bool {
		fs := s.scrape()
		return metric(fs, "flashgate_backend_order_events_published_total") >= 11 &&
			metric(fs, "flashgate_backend_order_events_backlog") == 0
	})
}

// The publisher runs all along while NATS is killed (a batch, payments and
// cancels are made meanwhile) and started again, and at once MySQL is killed
// for 10 s with those events still waiting, and started again; then the
// expiry sweep, a dead letter and the lane change more orders. Every change reaches the consumer
// exactly once, in order per order.
func TestOrderEventsAcrossNATSRestartAndMySQLOutage(t *testing.T) {
	t.Parallel()
	maria := testenv.StartMariaDB(t)
	natsSrv := testenv.StartNATS(t)
	db, err := mysql.OpenDB(maria.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := mysql.Migrate(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	rc := testenv.Redis(t, testenv.RedisAddrs())
	e := &env{t: t, cfg: config.Default(), db: db, rc: rc, scripts: lua.Load()}
	e.cfg.NATS.URL, e.cfg.NATS.User, e.cfg.NATS.Password = natsSrv.URL(), testenv.NATSUser(), testenv.NATSPassword()
	e.cfg.Events.Poll = 20 * time.Millisecond
	e.cfg.Events.BatchSize = 8 // many passes: the faults fall between them
	e.w = newOrderWriter(db, rc, e.scripts, quiet, metrics.NewBackend())
	e.warmer = newWarmer(db, rc, e.scripts, quiet)
	t.Cleanup(func() { e.warmer.stop(context.Background()) })
	nc, err := bus.Connect(e.cfg.NATS, "events-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bus.EnsureOrderEventStream(ctx(t), js, e.cfg.Events, 1); err != nil {
		t.Fatal(err)
	}
	p := &eventPublisher{db: db, js: js, cfg: e.cfg.Events, log: quiet, metrics: newEventMetrics(metrics.NewBackend().Registry())}
	pctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.run(pctx) }()
	t.Cleanup(func() { stop(); <-done })

	sale, changes := everyChange(t, e, func(step int) {
		switch step {
		case 1:
			natsSrv.Kill() // the second batch, the payments and the cancels wait in the outbox
		case 3:
			natsSrv.Start()
			maria.Kill()                 // while the publisher catches up
			time.Sleep(10 * time.Second) // MySQL down for 10 s, the publisher failing and backing off
			maria.Start()
		}
	})
	eventually(t, 30*time.Second, "the outbox drained", func() bool {
		ok, err := eventcheck.Drained(ctx(t), db)
		return err == nil && ok
	})
	validate, err := eventcheck.SchemaValidator()
	if err != nil {
		t.Fatal(err)
	}
	rep, err := eventcheck.Check(ctx(t), js, e.cfg.Events, db, sale.ID, validate)
	if err != nil {
		t.Fatal(err)
	}
	failures := counterValue(p.metrics.failures)
	t.Logf("publisher: %v passes failed, %v events published; consumer: %s", failures, counterValue(p.metrics.published), rep)
	if !rep.OK() || rep.Changes != changes {
		t.Fatalf("consumer saw %s for %d changes; problems %v", rep, changes, rep.Problems)
	}
	if failures == 0 {
		t.Error("no publisher pass failed: the faults missed the publisher")
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}
