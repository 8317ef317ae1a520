package backend

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// The command path under junk (docs/backend.md, "Order commands"): a buyer's
// commands of made-up or foreign ids take no lock, payments have workers of
// their own, and a full queue is answered at once.

// holdSaleLock takes sale's row lock in a transaction of its own, as a long
// batch would, until the returned function releases it.
func (e *env) holdSaleLock(sale string) func() {
	e.t.Helper()
	tx, err := e.db.BeginTx(ctx(e.t), nil)
	if err != nil {
		e.t.Fatal(err)
	}
	var id string
	if err := tx.QueryRowContext(ctx(e.t), `SELECT id FROM sales WHERE id = ? FOR UPDATE`, sale).Scan(&id); err != nil {
		e.t.Fatal(err)
	}
	var once sync.Once
	release := func() { once.Do(func() { _ = tx.Rollback() }) }
	e.t.Cleanup(release)
	return release
}

// within runs fn and fails the test if it takes d or more.
func within[T any](t *testing.T, d time.Duration, what string, fn func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- fn() }()
	select {
	case v := <-done:
		return v
	case <-time.After(d):
		t.Fatalf("%s: no answer within %v (it waits on the sale's row lock)", what, d)
		panic("unreachable")
	}
}

// TestForeignCommandsTakeNoLock: while the sale's row lock is held, someone
// else's cancel, and a cancel or a payment of an order that does not exist,
// are answered at once: whose order it is, and whether it exists, is read
// before any lock.
func TestForeignCommandsTakeNoLock(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	sale := spec(10, 2, nil)
	k := s.lifecycleSale(sale)
	m := s.confirmed(k, "u1", 1, "")
	release := s.holdSaleLock(sale.ID)
	missing := m
	missing.ID = m.ID + 1_000_003
	wantReply(t, "someone else's cancel", within(t, time.Second, "someone else's cancel", func() bus.OrderReply {
		return s.command(bus.CmdCancel, m, "mallory")
	}), string(flashgate.CodeOrderNotFound), "", "")
	wantReply(t, "cancel of a missing order", within(t, time.Second, "cancel of a missing order", func() bus.OrderReply {
		return s.command(bus.CmdCancel, missing, "u1")
	}), string(flashgate.CodeOrderNotFound), "", "")
	wantReply(t, "payment of a missing order", within(t, time.Second, "payment of a missing order", func() bus.OrderReply {
		return s.command(bus.CmdPay, missing, "")
	}), string(flashgate.CodeOrderNotFound), "", "")
	release()
	// The owner's cancel still works, under the lock as before.
	wantReply(t, "the owner's cancel", s.command(bus.CmdCancel, m, "u1"), bus.ReplyOK, "canceled", flashgate.ReasonCanceled)
}

// TestPaymentsHaveTheirOwnWorkers: with every cancel worker stuck on a sale's
// row lock and cancels queued behind them, a payment of another sale's
// order is paid at once.
func TestPaymentsHaveTheirOwnWorkers(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	hot, other := spec(10, 2, nil), spec(10, 2, nil)
	kh, ko := s.lifecycleSale(hot), s.lifecycleSale(other)
	victim := s.confirmed(kh, "u1", 1, "")
	toPay := s.confirmed(ko, "u2", 1, "")
	release := s.holdSaleLock(hot.ID)
	// Three times the workers: over the queue group's subscriptions and the
	// pools, every cancel worker is taken.
	var wg sync.WaitGroup
	for range 3 * commandWorkers {
		wg.Go(func() {
			c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, _ = bus.Command(c, s.nc, s.cfg.NATS, bus.OrderCommand{Op: bus.CmdCancel, SaleID: hot.ID, OrderID: victim.ID, UserID: "u1"})
		})
	}
	time.Sleep(300 * time.Millisecond) // the cancels reach the workers and block
	r := within(t, 2*time.Second, "a payment beside stuck cancels", func() bus.OrderReply {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := bus.Command(c, s.nc, s.cfg.NATS, bus.PayCommand(flashgate.Payment{OrderID: toPay.ID, SaleID: other.ID,
			PaymentID: payID(toPay), AmountCents: 990}))
		if err != nil {
			return bus.OrderReply{Code: "error", Message: err.Error()}
		}
		return r
	})
	wantReply(t, "payment", r, bus.ReplyOK, "paid", "")
	release()
	wg.Wait()
}

// TestFullCommandQueueAnswersAtOnce: past the workers and the bounded queue,
// a command is answered unavailable at once, with how long the queue takes to
// work off (the gateway's Retry-After).
func TestFullCommandQueueAnswersAtOnce(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	hot := spec(10, 2, nil)
	kh := s.lifecycleSale(hot)
	victim := s.confirmed(kh, "u1", 1, "")
	release := s.holdSaleLock(hot.ID)
	n := commandWorkers + commandQueue + 40
	type answer struct {
		r   bus.OrderReply
		err error
		d   time.Duration
	}
	answers := make(chan answer, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			r, err := bus.Command(c, s.nc, s.cfg.NATS, bus.OrderCommand{Op: bus.CmdCancel, SaleID: hot.ID, OrderID: victim.ID, UserID: "u1"})
			answers <- answer{r, err, time.Since(start)}
		})
	}
	// The busy answers come while the lock is still held.
	busy := 0
	deadline := time.After(2 * time.Second)
collect:
	for busy < n-commandWorkers-commandQueue {
		select {
		case a := <-answers:
			if a.err != nil {
				t.Fatalf("command: %v", a.err)
			}
			if a.r.Code != string(flashgate.CodeUnavailable) || a.r.RetryAfterMS <= 0 || a.d > time.Second {
				t.Fatalf("an answer while the workers are stuck and the queue full: %+v after %v", a.r, a.d)
			}
			busy++
		case <-deadline:
			break collect
		}
	}
	release()
	wg.Wait()
	if busy == 0 {
		t.Fatalf("%d cancels behind a held lock: none answered busy at once", n)
	}
	t.Logf("%d of %d answered busy at once", busy, n)
}

// TestRebuildStampsItsTime: a rebuild writes when it ran (lua.MetaRebuilt, by
// Redis's clock) into the meta of every tag: what lets a gateway answer 404
// for a newer id the buyer's records do not hold.
func TestRebuildStampsItsTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.RedisAddrs())
	for _, buckets := range []int{0, 3} {
		s := spec(30, 2, nil)
		before := time.Now().Add(-time.Second)
		var k *lua.Keys
		if buckets == 0 {
			k = e.createSale(s)
		} else {
			k = e.createSplitSale(s, buckets)
		}
		tags := k.Tags()
		if len(tags) != buckets+1 {
			t.Fatalf("%d buckets: %d tags", buckets, len(tags))
		}
		for _, tag := range tags {
			v, err := e.rc.Do(ctx(t), e.rc.B().Hget().Key(tag.Meta).Field(lua.MetaRebuilt).Build()).ToString()
			if err != nil {
				t.Fatalf("%d buckets: %s: %v", buckets, tag.Meta, err)
			}
			at, err := strconv.ParseInt(v, 10, 64)
			if err != nil || time.UnixMilli(at).Before(before) || time.UnixMilli(at).After(time.Now().Add(time.Second)) {
				t.Fatalf("%d buckets: %s rebuilt %q, want about now", buckets, tag.Meta, v)
			}
		}
	}
}
