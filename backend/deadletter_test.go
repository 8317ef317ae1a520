package backend

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
)

// fewDeliveries gives up on a message after 3 deliveries, quickly.
func fewDeliveries(c *config.Config) {
	c.Backend.MaxDeliver = 3
	c.Backend.AckWait = time.Second
}

// deadLetters reads the dead-letter stream.
func (s *started) deadLetters() []*jetstream.RawStreamMsg {
	s.t.Helper()
	st, err := s.js.Stream(ctx(s.t), bus.DeadLetterStream(s.cfg.NATS))
	if err != nil {
		s.t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := uint64(1); ; seq++ {
		m, err := st.GetMsg(ctx(s.t), seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out
		}
		if err != nil {
			s.t.Fatal(err)
		}
		out = append(out, m)
	}
}

func TestLastTry(t *testing.T) {
	for _, c := range []struct {
		maxDeliver int
		want       uint64
	}{{-1, unlimitedLastTry}, {0, unlimitedLastTry}, {1, 1}, {2, 2}, {3, 3}, {10, 10}} {
		if got := lastTry(c.maxDeliver); got != c.want {
			t.Errorf("lastTry(%d) = %d, want %d", c.maxDeliver, got, c.want)
		}
	}
}

// A poison order (MySQL fails it every time: its quantity overflows the sale's
// counter) is dead-lettered after its deliveries: a copy in the dead-letter
// stream saying why, the order failed (dead_letter) in MySQL, its reserved
// unit back in Redis. The orders around it, in its batch and after it, are
// written all the same.
func TestPoisonOrderDeadLettered(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), fewDeliveries)
	sale := spec(30, 5, nil)
	k := s.createSale(sale)
	first := admit(t, s.rc, k, "u0", 1, "")
	s.publish(first)
	eventually(t, 10*time.Second, "first order written", func() bool { return s.rows(sale.ID, "confirmed") == 1 })

	poison := admit(t, s.rc, k, "p", 1, "")
	// MySQL refuses the insert of its row, every time.
	s.poisonInserts("p")
	var good []flashgate.Order
	for i := range 20 {
		good = append(good, admit(t, s.rc, k, "g"+strconv.Itoa(i), 1, ""))
	}
	for i, m := range good {
		if i == 7 {
			s.publish(poison)
		}
		s.publish(m)
	}
	eventually(t, 10*time.Second, "the good orders beside the poison written", func() bool {
		return s.rows(sale.ID, "confirmed") == 21
	})
	eventually(t, 15*time.Second, "poison order failed", func() bool {
		st, _, ok := s.order(poison.ID)
		return ok && st == "failed"
	})
	if st, why, _ := s.order(poison.ID); st != "failed" || why != ReasonDeadLetter {
		t.Fatalf("poison row: %s/%s", st, why)
	}
	// Redis hears of it after MySQL: wait for the write-back.
	eventually(t, 10*time.Second, "poison failed in Redis", func() bool {
		st, why := redisStatus(t, s.rc, k, poison.ID)
		return st == "failed" && why == ReasonDeadLetter
	})
	if got := remaining(t, s.rc, k, ""); got != 30-21 {
		t.Fatalf("remaining %d: the poison's unit did not come back", got)
	}
	eventually(t, 5*time.Second, "consumer idle", s.consumerIdle)

	dl := s.deadLetters()
	if len(dl) != 1 {
		t.Fatalf("%d dead letters", len(dl))
	}
	m := dl[0]
	if m.Subject != bus.DeadLetterSubject(s.cfg.NATS, bus.DeadPoison, sale.ID) ||
		m.Header.Get(bus.HdrDeadKind) != bus.DeadPoison ||
		m.Header.Get(bus.HdrDeadOrder) != strconv.FormatUint(poison.ID, 10) ||
		m.Header.Get(bus.HdrDeadDeliveries) != "3" || m.Header.Get(bus.HdrDeadError) == "" ||
		m.Header.Get(bus.HdrDeadSubject) != bus.OrderSubject(s.cfg.NATS, sale.ID) {
		t.Fatalf("dead letter %s %v", m.Subject, m.Header)
	}
	if o, err := bus.DecodeOrder(m.Data); err != nil || o != poison {
		t.Fatalf("dead letter body %q: %v", m.Data, err)
	}
	t.Logf("dead letter: %s %v", m.Subject, m.Header)

	// Later orders of the sale still go through.
	late := admit(t, s.rc, k, "late", 1, "")
	s.publish(late)
	eventually(t, 10*time.Second, "late order written", func() bool { return s.rows(sale.ID, "confirmed") == 22 })
	accepted := append(ids(good), first.ID, poison.ID, late.ID)
	eventually(t, 5*time.Second, "consumer idle", s.consumerIdle)
	if r := check(t, s.env, sale.ID, accepted); !r.OK() || r.Sold != 22 {
		t.Fatalf("audit: %v", r)
	}
	fs := s.scrape()
	if got := metric(fs, "flashgate_backend_dead_letters_total", "kind", "poison"); got != 1 {
		t.Errorf("dead_letters_total{poison} = %v", got)
	}
}

// Messages that can never be parsed go to the dead-letter stream as they are
// and do not hold up the orders behind them.
func TestUnparseableDeadLettered(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), fewDeliveries)
	sale := spec(10, 5, nil)
	k := s.createSale(sale)
	subject := bus.OrderSubject(s.cfg.NATS, sale.ID)
	bodies := []string{"not json", `{"id":"1","sale":"x y","user":"u","qty":1}`}
	for _, b := range bodies {
		if _, err := s.js.Publish(ctx(t), subject, []byte(b)); err != nil {
			t.Fatal(err)
		}
	}
	m := admit(t, s.rc, k, "u1", 1, "")
	s.publish(m)
	eventually(t, 10*time.Second, "the order behind them written", func() bool { return s.rows(sale.ID, "confirmed") == 1 })
	eventually(t, 5*time.Second, "consumer idle", s.consumerIdle)
	dl := s.deadLetters()
	if len(dl) != 2 {
		t.Fatalf("%d dead letters", len(dl))
	}
	for i, d := range dl {
		if string(d.Data) != bodies[i] || d.Subject != bus.DeadLetterSubject(s.cfg.NATS, bus.DeadUnparseable, sale.ID) ||
			d.Header.Get(bus.HdrDeadKind) != bus.DeadUnparseable || d.Header.Get(bus.HdrDeadSequence) == "" {
			t.Fatalf("dead letter %d: %s %q %v", i, d.Subject, d.Data, d.Header)
		}
	}
}

// An order tried more often than its deliveries while MySQL is away is no
// poison: it waits in the backend, not dead-lettered, and is written when
// MySQL is back.
func TestOutageIsNotPoison(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), fewDeliveries)
	sale := spec(10, 2, nil)
	k := s.createSale(sale)
	if _, err := s.db.ExecContext(ctx(t), `RENAME TABLE orders TO orders_away`); err != nil {
		t.Fatal(err)
	}
	m := admit(t, s.rc, k, "u1", 1, "")
	s.publish(m)
	// It waits through more probes than its 3 deliveries would have lasted
	// (the probes' pauses add up to 0.25 + 0.5 + 1 + 2 s, the deliveries to
	// 3 × 1 s of ack wait).
	eventually(t, 20*time.Second, "waiting through the outage", func() bool {
		fs := s.scrape()
		return metric(fs, "flashgate_backend_outage_probes_total") >= 4 && metric(fs, "flashgate_backend_orders_waiting") == 1
	})
	if _, err := s.db.ExecContext(ctx(t), `RENAME TABLE orders_away TO orders`); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "written after the outage", func() bool { return s.rows(sale.ID, "confirmed") == 1 })
	eventually(t, 10*time.Second, "consumer idle", s.consumerIdle)
	if dl := s.deadLetters(); len(dl) != 0 {
		t.Fatalf("%d dead letters in an outage", len(dl))
	}
	if st, _ := redisStatus(t, s.rc, k, m.ID); st != "confirmed" {
		t.Fatalf("redis status %s", st)
	}
	if r := check(t, s.env, sale.ID, []uint64{m.ID}); !r.OK() {
		t.Fatalf("audit: %v", r)
	}
}

// A poison order whose dead-lettering fails on its last delivery (the
// dead-letter stream is gone for a while) is not left in the orders stream.
// Before, the server gave up on it after max_deliver deliveries: never
// delivered again, it stayed in the work-queue stream for good (reconcile
// counts it waiting, repair and retention wait on it). Now the server never
// gives up, and a later delivery dead-letters it.
func TestPoisonOutlivingItsDeliveriesLeavesTheStream(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), fewDeliveries)
	sale := spec(10, 5, nil)
	k := s.createSale(sale)
	dlq := bus.DeadLetterStream(s.cfg.NATS)
	if err := s.js.DeleteStream(ctx(t), dlq); err != nil {
		t.Fatal(err)
	}
	poison := admit(t, s.rc, k, "p", 1, "")
	s.poisonInserts("p") // MySQL refuses its row, every time
	s.publish(poison)
	orders, err := s.js.Stream(ctx(t), s.cfg.NATS.Stream)
	if err != nil {
		t.Fatal(err)
	}
	// Delivered more often than max_deliver, or given up on by the server
	// (nothing pending or unacked, the message still in the stream).
	eventually(t, 30*time.Second, "deliveries past max_deliver", func() bool {
		if s.deliveries() > 3 {
			return true
		}
		c, err := s.js.Consumer(ctx(t), s.cfg.NATS.Stream, s.cfg.NATS.Consumer)
		if err != nil {
			t.Fatal(err)
		}
		ci, err := c.Info(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		si, err := orders.Info(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		return s.deliveries() == 3 && ci.NumAckPending == 0 && ci.NumPending == 0 && si.State.Msgs == 1
	})
	if _, err := bus.EnsureDeadLetterStream(ctx(t), s.js, s.cfg.NATS); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the poison order dead-lettered", func() bool {
		st, why, ok := s.order(poison.ID)
		return ok && st == "failed" && why == ReasonDeadLetter
	})
	eventually(t, 30*time.Second, "the orders stream empty", func() bool {
		si, err := orders.Info(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		return si.State.Msgs == 0
	})
	if dl := s.deadLetters(); len(dl) != 1 {
		t.Fatalf("%d dead letters", len(dl))
	}
}
