package backend

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// lifecycleSale creates s in MySQL and Redis and drops its restocked set when
// the test ends (cleanRedis does not know that key).
func (e *env) lifecycleSale(s *flashgate.Sale) *lua.Keys {
	e.t.Helper()
	k := e.createSale(s)
	e.t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		e.rc.Do(c, e.rc.B().Del().Key(k.Restocked()).Build())
	})
	return k
}

// confirmedOrders admits orders like a gateway (user of each given by user(i)),
// with a payment deadline of payBy, and writes them to MySQL like the consumer.
func (e *env) confirmedOrders(k *lua.Keys, n int, qty int64, region string, payBy time.Time, user func(int) string) []flashgate.Order {
	e.t.Helper()
	msgs := make([]flashgate.Order, n)
	for i := range msgs {
		msgs[i] = admit(e.t, e.rc, k, user(i), qty, region)
		msgs[i].ExpiresAt = ms(payBy.UnixMilli())
	}
	for start := 0; start < n; start += 500 {
		for _, o := range e.process(k.Sale, msgs[start:min(start+500, n)]) {
			if o.Status != flashgate.OrderConfirmed {
				e.t.Fatalf("order %d: %+v", o.ID, o)
			}
		}
	}
	// The writer sets the deadline from orders.payment_timeout, whatever the
	// message says (distrust.go): the test's is set in MySQL.
	e.setPayBy(msgs, payBy)
	return msgs
}

func (e *env) confirmed(k *lua.Keys, user string, qty int64, region string) flashgate.Order {
	e.t.Helper()
	return e.confirmedOrders(k, 1, qty, region, time.Now().Add(15*time.Minute), func(int) string { return user })[0]
}

// command carries out an order command as a backend receives it.
// command runs op on m for user; a pay is the payment service's (it names no
// user): the order's full price (spec's), under a payment id of the order's.
func (s *started) command(op string, m flashgate.Order, user string) bus.OrderReply {
	s.t.Helper()
	if op == bus.CmdPay {
		return s.pay(m, payID(m), 990*m.Quantity)
	}
	return s.b.life.handleCommand(bus.OrderCommand{Op: op, SaleID: m.SaleID, OrderID: m.ID, UserID: user})
}

// pay runs the payment of m by payment id with amount.
func (s *started) pay(m flashgate.Order, id string, amount int64) bus.OrderReply {
	s.t.Helper()
	return s.b.life.handleCommand(bus.PayCommand(flashgate.Payment{OrderID: m.ID, SaleID: m.SaleID, PaymentID: id, AmountCents: amount}))
}

func payID(m flashgate.Order) string { return "pi_" + strconv.FormatUint(m.ID, 10) }

func wantReply(t *testing.T, what string, r bus.OrderReply, code, status, reason string) {
	t.Helper()
	if r.Code != code || r.Status != status || r.Reason != reason {
		t.Fatalf("%s = %+v, want code %q status %q reason %q", what, r, code, status, reason)
	}
}

func (e *env) regionSold(sale, region string) int64 {
	return e.queryInt(`SELECT sold FROM sale_regions WHERE sale_id = ? AND region = ?`, sale, region)
}

// held is the buyer's units in the Redis users hash.
func held(t testing.TB, rc rueidis.Client, k *lua.Keys, user string) int64 {
	t.Helper()
	n, err := rc.Do(ctx(t), rc.B().Hget().Key(k.Users).Field(user).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// restockedEvents collects the restocked events of sale.
func (s *started) restockedEvents(sale string) <-chan bus.SaleEvent {
	s.t.Helper()
	events := make(chan bus.SaleEvent, 64)
	sub, err := bus.SubscribeEvents(s.nc, s.cfg.NATS, func(ev bus.SaleEvent) {
		if ev.SaleID == sale && ev.Type == bus.EventRestocked {
			events <- ev
		}
	})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := s.nc.Flush(); err != nil {
		s.t.Fatal(err)
	}
	return events
}

func noEvent(t *testing.T, ch <-chan bus.SaleEvent) {
	t.Helper()
	select {
	case ev := <-ch:
		t.Fatalf("unexpected event %+v", ev)
	case <-time.After(100 * time.Millisecond):
	}
}

func (s *started) auditOK(sale string) {
	s.t.Helper()
	if r := check(s.t, s.env, sale, nil); !r.OK() || r.RedisReserved != 0 {
		s.t.Fatalf("audit: %v", r)
	}
}

func TestPay(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	sale := spec(10, 2, nil)
	k := s.lifecycleSale(sale)
	ok, closed := bus.ReplyOK, string(flashgate.CodeOrderClosed)

	t.Run("confirmed, twice", func(t *testing.T) {
		m := s.confirmed(k, "u1", 2, "")
		for i := range 2 {
			r := s.command(bus.CmdPay, m, "u1")
			wantReply(t, "pay #"+strconv.Itoa(i), r, ok, "paid", "")
			if r.Quantity != 2 || r.ExpiresAt.UnixMilli() != m.ExpiresAt.UnixMilli() || r.CreatedAt.UnixMilli() != m.CreatedAt.UnixMilli() {
				t.Fatalf("reply fields: %+v", r)
			}
			if st, _, _ := s.order(m.ID); st != "paid" {
				t.Fatalf("MySQL status %q", st)
			}
			if st, _ := redisStatus(t, s.rc, k, m.ID); st != "paid" {
				t.Fatalf("Redis status %q", st)
			}
		}
		// Paid units stay sold.
		if s.sold(sale.ID) != 2 || held(t, s.rc, k, "u1") != 2 {
			t.Fatalf("sold %d, held %d", s.sold(sale.ID), held(t, s.rc, k, "u1"))
		}
		// A paid order cannot be canceled.
		wantReply(t, "cancel of a paid order", s.command(bus.CmdCancel, m, "u1"), closed, "paid", "")
	})

	t.Run("someone else's or no order", func(t *testing.T) {
		m := s.confirmed(k, "u2", 1, "")
		wantReply(t, "cancel by another user", s.command(bus.CmdCancel, m, "u3"), string(flashgate.CodeOrderNotFound), "", "")
		if st, _, _ := s.order(m.ID); st != "confirmed" {
			t.Fatalf("status %q", st)
		}
		none := m
		none.ID = nextID.Add(1)
		wantReply(t, "pay of no order", s.command(bus.CmdPay, none, "u2"), string(flashgate.CodeOrderNotFound), "", "")
		wantReply(t, "cancel of no order", s.command(bus.CmdCancel, none, "u2"), string(flashgate.CodeOrderNotFound), "", "")
		other := m
		other.SaleID = "no-such-sale"
		wantReply(t, "pay under another sale", s.command(bus.CmdPay, other, "u2"), string(flashgate.CodeOrderNotFound), "", "")
	})

	t.Run("pending", func(t *testing.T) {
		m := admit(t, s.rc, k, "u4", 1, "") // admitted, not yet in MySQL
		wantReply(t, "pay of a pending order", s.command(bus.CmdPay, m, ""), string(flashgate.CodeConflict), "pending", "")
		wantReply(t, "cancel of a pending order", s.command(bus.CmdCancel, m, "u4"), string(flashgate.CodeConflict), "pending", "")
		wantReply(t, "cancel of another's pending order", s.command(bus.CmdCancel, m, "u5"), string(flashgate.CodeOrderNotFound), "", "")
		s.process(sale.ID, []flashgate.Order{m})
		wantReply(t, "pay once confirmed", s.command(bus.CmdPay, m, "u4"), ok, "paid", "")
	})

	t.Run("expired", func(t *testing.T) {
		events := s.restockedEvents(sale.ID)
		m := s.confirmedOrders(k, 1, 1, "", time.Now().Add(-time.Second), func(int) string { return "u6" })[0]
		before, left := s.sold(sale.ID), remaining(t, s.rc, k, "")
		wantReply(t, "pay of an expired order", s.command(bus.CmdPay, m, "u6"), closed, "canceled", flashgate.ReasonExpired)
		if st, why, _ := s.order(m.ID); st != "canceled" || why != flashgate.ReasonExpired {
			t.Fatalf("MySQL %s/%s", st, why)
		}
		if st, why := redisStatus(t, s.rc, k, m.ID); st != "canceled" || why != flashgate.ReasonExpired {
			t.Fatalf("Redis %s/%s", st, why)
		}
		if s.sold(sale.ID) != before-1 || remaining(t, s.rc, k, "") != left+1 || s.units(sale.ID, "u6") != 0 || held(t, s.rc, k, "u6") != 0 {
			t.Fatalf("units not back: sold %d→%d, remaining %d→%d", before, s.sold(sale.ID), left, remaining(t, s.rc, k, ""))
		}
		nextEvent(t, events)
		wantReply(t, "pay again", s.command(bus.CmdPay, m, "u6"), closed, "canceled", flashgate.ReasonExpired)
		noEvent(t, events)
	})

	t.Run("canceled", func(t *testing.T) {
		m := s.confirmed(k, "u7", 1, "")
		wantReply(t, "cancel", s.command(bus.CmdCancel, m, "u7"), ok, "canceled", flashgate.ReasonCanceled)
		wantReply(t, "pay of a canceled order", s.command(bus.CmdPay, m, "u7"), closed, "canceled", flashgate.ReasonCanceled)
	})

	t.Run("failed", func(t *testing.T) {
		closedSale := spec(5, 1, nil)
		ck := s.lifecycleSale(closedSale)
		m := admit(t, s.rc, ck, "u8", 1, "")
		// Closed a minute before the admission: the writer fails the order.
		if err := closeSaleRow(ctx(t), s.db, closedSale.ID, m.CreatedAt.Add(-time.Minute)); err != nil {
			t.Fatal(err)
		}
		s.process(closedSale.ID, []flashgate.Order{m})
		wantReply(t, "pay of a failed order", s.command(bus.CmdPay, m, "u8"), closed, "failed", flashgate.ReasonSaleClosed)
		wantReply(t, "cancel of a failed order", s.command(bus.CmdCancel, m, "u8"), closed, "failed", flashgate.ReasonSaleClosed)
		s.auditOK(closedSale.ID)
	})
	s.auditOK(sale.ID)
}

func TestCancel(t *testing.T) {
	t.Parallel()
	for _, target := range []struct {
		name  string
		addrs []string
	}{{"standalone", testenv.RedisAddrs()}, {"cluster", testenv.ClusterAddrs()}} {
		t.Run(target.name, func(t *testing.T) {
			t.Parallel()
			s := start(t, target.addrs, nil)
			for _, region := range []string{"", "bj"} {
				t.Run("region="+region, func(t *testing.T) {
					var regions map[string]int64
					if region != "" {
						regions = map[string]int64{"bj": 2, "sh": 2}
					}
					sale := spec(4, 2, regions)
					if region == "" {
						sale.Total = 2
					}
					k := s.lifecycleSale(sale)
					events := s.restockedEvents(sale.ID)

					m := s.confirmed(k, "u1", 2, region)
					// Sold out (in the region): nobody can buy.
					a := lua.AdmitArgs{User: "u2", Quantity: 1, OrderID: nextID.Add(1), Now: time.Now(), Region: region, PayBy: time.Now().Add(time.Minute)}
					if got, err := s.scripts.Admit(ctx(t), s.rc, k, a); err != nil || got.Outcome != lua.SoldOut {
						t.Fatalf("admit before cancel = %+v, %v", got, err)
					}

					r := s.command(bus.CmdCancel, m, "u1")
					wantReply(t, "cancel", r, bus.ReplyOK, "canceled", flashgate.ReasonCanceled)
					if r.Quantity != 2 || r.Region != region {
						t.Fatalf("reply: %+v", r)
					}
					if st, why, _ := s.order(m.ID); st != "canceled" || why != flashgate.ReasonCanceled {
						t.Fatalf("MySQL %s/%s", st, why)
					}
					if st, why := redisStatus(t, s.rc, k, m.ID); st != "canceled" || why != flashgate.ReasonCanceled {
						t.Fatalf("Redis %s/%s", st, why)
					}
					// The units are back on sale; the buyer's quota is not given
					// back within the sale (MySQL's user_purchases, Redis's users).
					returned := func() {
						t.Helper()
						if s.sold(sale.ID) != 0 || s.units(sale.ID, "u1") != 2 || remaining(t, s.rc, k, region) != 2 || held(t, s.rc, k, "u1") != 2 {
							t.Fatalf("sold %d, units %d, remaining %d, held %d", s.sold(sale.ID), s.units(sale.ID, "u1"),
								remaining(t, s.rc, k, region), held(t, s.rc, k, "u1"))
						}
						if region != "" && s.regionSold(sale.ID, region) != 0 {
							t.Fatalf("region sold %d", s.regionSold(sale.ID, region))
						}
						s.auditOK(sale.ID)
					}
					returned()
					if ev := nextEvent(t, events); ev.Region != region {
						t.Fatalf("restocked event %+v", ev)
					}

					// Again: ok, and the units go back once.
					wantReply(t, "cancel again", s.command(bus.CmdCancel, m, "u1"), bus.ReplyOK, "canceled", flashgate.ReasonCanceled)
					returned()
					noEvent(t, events)

					// The first buyer may not buy again within the sale, though
					// the units are on sale (a scalper's hand-off to a waiting
					// account would otherwise take one cancel per unit); someone
					// else buys them.
					again := lua.AdmitArgs{User: "u1", Quantity: 1, OrderID: nextID.Add(1), Now: time.Now(), Region: region, PayBy: time.Now().Add(time.Minute)}
					if got, err := s.scripts.Admit(ctx(t), s.rc, k, again); err != nil || got.Outcome != lua.LimitReached {
						t.Fatalf("the buyer who canceled buys again = %+v, %v; want limit_reached", got, err)
					}
					s.confirmed(k, "u2", 2, region)
					s.auditOK(sale.ID)
				})
			}
		})
	}
}

// A backend died between the cancel's commit and its Redis restock: MySQL has
// the order canceled, Redis still holds its units. Canceling again (or
// reconcile, running the same restock) puts them back, once.
func TestCancelHealsRedis(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	sale := spec(5, 2, nil)
	k := s.lifecycleSale(sale)
	// cancelInMySQL is a cancel whose backend died right after the commit.
	cancelInMySQL := func(m flashgate.Order) {
		t.Helper()
		tx, err := beginRC(ctx(t), s.db)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		o, err := lockOrder(ctx(t), tx, sale.ID, m.ID)
		if err != nil {
			t.Fatal(err)
		}
		if err := returnUnits(ctx(t), tx, sale.ID, []flashgate.Order{o}, flashgate.ReasonCanceled, time.Now()); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	m := s.confirmed(k, "u1", 2, "")
	cancelInMySQL(m)
	if r := check(t, s.env, sale.ID, nil); r.LedgerDiff != -2 {
		t.Fatalf("audit before the heal: %v", r)
	}
	for range 2 {
		wantReply(t, "cancel", s.command(bus.CmdCancel, m, "u1"), bus.ReplyOK, "canceled", flashgate.ReasonCanceled)
		// The units back; the buyer's quota kept (a buyer's cancel).
		if remaining(t, s.rc, k, "") != 5 || held(t, s.rc, k, "u1") != 2 {
			t.Fatalf("remaining %d, held %d", remaining(t, s.rc, k, ""), held(t, s.rc, k, "u1"))
		}
		s.auditOK(sale.ID)
	}

	// Reconcile's way: every order canceled in MySQL, restocked again.
	m2, m3 := s.confirmed(k, "u2", 2, ""), s.confirmed(k, "u3", 1, "")
	cancelInMySQL(m2)
	for i, want := range []int{1, 0} {
		n, err := s.b.life.restockCanceled(ctx(t), sale.ID, time.Time{})
		if err != nil || n != want {
			t.Fatalf("restockCanceled #%d = %d, %v; want %d", i, n, err, want)
		}
		if remaining(t, s.rc, k, "") != 4 || held(t, s.rc, k, "u2") != 2 {
			t.Fatalf("remaining %d, held %d", remaining(t, s.rc, k, ""), held(t, s.rc, k, "u2"))
		}
		s.auditOK(sale.ID)
	}
	if st, _ := redisStatus(t, s.rc, k, m3.ID); st != "confirmed" {
		t.Fatalf("a live order was touched: %q", st)
	}
	if n, err := s.b.life.restockCanceled(ctx(t), sale.ID, time.Now().Add(time.Minute)); err != nil || n != 0 {
		t.Fatalf("restockCanceled of nothing = %d, %v", n, err)
	}
}

// Pay and cancel race for the same orders: each order ends paid or canceled,
// matching the replies, and the ledger holds.
func TestPayCancelRace(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	sale := spec(100, 1, nil)
	k := s.lifecycleSale(sale)
	msgs := s.confirmedOrders(k, 40, 1, "", time.Now().Add(time.Minute), func(i int) string { return "u" + strconv.Itoa(i) })
	var wg sync.WaitGroup
	replies := make([][2]bus.OrderReply, len(msgs))
	for i, m := range msgs {
		wg.Go(func() { replies[i][0] = s.command(bus.CmdPay, m, m.UserID) })
		wg.Go(func() { replies[i][1] = s.command(bus.CmdCancel, m, m.UserID) })
	}
	wg.Wait()
	var paid int64
	for i, m := range msgs {
		pay, cancel := replies[i][0], replies[i][1]
		st, _, _ := s.order(m.ID)
		switch st {
		case "paid":
			paid++
			if pay.Code != bus.ReplyOK || cancel.Code != string(flashgate.CodeOrderClosed) {
				t.Errorf("order %d paid: pay %+v, cancel %+v", m.ID, pay, cancel)
			}
		case "canceled":
			if cancel.Code != bus.ReplyOK || pay.Code != string(flashgate.CodeOrderClosed) {
				t.Errorf("order %d canceled: pay %+v, cancel %+v", m.ID, pay, cancel)
			}
		default:
			t.Errorf("order %d ended %q", m.ID, st)
		}
	}
	if s.sold(sale.ID) != paid {
		t.Errorf("sold %d, paid %d", s.sold(sale.ID), paid)
	}
	s.auditOK(sale.ID)
	t.Logf("%d paid, %d canceled", paid, int64(len(msgs))-paid)
}

func TestSweepExpired(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	const past, future = 2000, 100
	sale := spec(3000, 10, nil)
	k := s.lifecycleSale(sale)
	events := s.restockedEvents(sale.ID)
	user := func(i int) string { return "u" + strconv.Itoa(i%400) }
	expired := s.confirmedOrders(k, past, 1, "", time.Now().Add(-time.Minute), user)
	live := s.confirmedOrders(k, future, 1, "", time.Now().Add(time.Hour), user)
	if s.sold(sale.ID) != past+future {
		t.Fatalf("sold %d", s.sold(sale.ID))
	}

	begin := time.Now()
	n, err := s.b.life.sweepExpired(ctx(t), time.Now(), sweepLimit)
	took := time.Since(begin)
	if err != nil || n != past {
		t.Fatalf("sweep = %d, %v; want %d", n, err, past)
	}
	t.Logf("swept %d expired orders in %v: %.0f orders/s", n, took, float64(n)/took.Seconds())

	if got := s.rows(sale.ID, "canceled"); got != past {
		t.Fatalf("canceled rows %d", got)
	}
	if got := s.queryInt(`SELECT COUNT(*) FROM orders WHERE sale_id = ? AND reason = ?`, sale.ID, flashgate.ReasonExpired); got != past {
		t.Fatalf("expired rows %d", got)
	}
	for _, m := range live {
		if st, _, _ := s.order(m.ID); st != "confirmed" {
			t.Fatalf("a live order ended %q", st)
		}
	}
	for _, m := range expired[:10] {
		if st, why := redisStatus(t, s.rc, k, m.ID); st != "canceled" || why != flashgate.ReasonExpired {
			t.Fatalf("Redis %s/%s", st, why)
		}
	}
	if s.sold(sale.ID) != future || remaining(t, s.rc, k, "") != sale.Total-future {
		t.Fatalf("sold %d, remaining %d", s.sold(sale.ID), remaining(t, s.rc, k, ""))
	}
	s.auditOK(sale.ID)
	nextEvent(t, events)

	if n, err := s.b.life.sweepExpired(ctx(t), time.Now(), sweepLimit); err != nil || n != 0 {
		t.Fatalf("second sweep = %d, %v", n, err)
	}
}

// Two sweepers (a leader hand-over) on the same backlog of several sales,
// regions among them, each sweeping in small passes: every order expires once,
// its units come back once.
func TestConcurrentSweepers(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	flat := spec(1000, 5, nil)
	regional := spec(1000, 5, map[string]int64{"bj": 500, "sh": 500})
	kf, kr := s.lifecycleSale(flat), s.lifecycleSale(regional)
	payBy := time.Now().Add(-time.Second)
	user := func(i int) string { return "u" + strconv.Itoa(i%300) }
	s.confirmedOrders(kf, 600, 1, "", payBy, user)
	s.confirmedOrders(kr, 300, 1, "bj", payBy, user)
	s.confirmedOrders(kr, 200, 2, "sh", payBy, user)
	s.confirmedOrders(kr, 50, 2, "sh", time.Now().Add(time.Hour), user)

	var wg sync.WaitGroup
	counts := make([]int, 2)
	begin := time.Now()
	for w := range counts {
		wg.Go(func() {
			for {
				n, err := s.b.life.sweepExpired(ctx(t), time.Now(), 300)
				if err != nil {
					t.Error(err)
					return
				}
				counts[w] += n
				if n == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(begin)
	if counts[0]+counts[1] != 1100 {
		t.Fatalf("sweepers expired %v, want 1100 in all", counts)
	}
	t.Logf("two sweepers expired %v in %v: %.0f orders/s", counts, took, 1100/took.Seconds())
	if s.sold(flat.ID) != 0 || s.sold(regional.ID) != 100 || s.regionSold(regional.ID, "bj") != 0 || s.regionSold(regional.ID, "sh") != 100 {
		t.Fatalf("sold: flat %d, regional %d (sh %d)", s.sold(flat.ID), s.sold(regional.ID), s.regionSold(regional.ID, "sh"))
	}
	if remaining(t, s.rc, kf, "") != 1000 || remaining(t, s.rc, kr, "bj") != 500 || remaining(t, s.rc, kr, "sh") != 400 {
		t.Fatalf("remaining: flat %d, bj %d, sh %d", remaining(t, s.rc, kf, ""), remaining(t, s.rc, kr, "bj"), remaining(t, s.rc, kr, "sh"))
	}
	s.auditOK(flat.ID)
	s.auditOK(regional.ID)
}

// The payment timeout storm of issue 4: 10,000 unpaid orders of one sale expire
// at once. Logs the sweeper's rate (expired orders per second).
func TestSweepStorm(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	const n = 10000
	sale := spec(n, 5, nil)
	k := s.lifecycleSale(sale)
	setup := time.Now()
	s.confirmedOrders(k, n, 1, "", time.Now().Add(-time.Second), func(i int) string { return "u" + strconv.Itoa(i%2000) })
	t.Logf("%d confirmed orders set up in %v", n, time.Since(setup))

	sctx, stop := context.WithCancel(ctx(t))
	defer stop()
	begin := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.b.life.runSweeper(sctx, 10*time.Millisecond)
	}()
	eventually(t, 60*time.Second, "every order expired", func() bool { return s.sold(sale.ID) == 0 })
	took := time.Since(begin)
	stop()
	<-done
	t.Logf("storm: %d orders expired in %v: %.0f orders/s", n, took, n/took.Seconds())
	if remaining(t, s.rc, k, "") != n {
		t.Fatalf("remaining %d", remaining(t, s.rc, k, ""))
	}
	s.auditOK(sale.ID)
}

// Pay and cancel through NATS, as a gateway sends them.
func TestCommandsOverNATS(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	sale := spec(10, 2, nil)
	k := s.lifecycleSale(sale)
	paid, canceled := s.confirmed(k, "u1", 1, ""), s.confirmed(k, "u2", 2, "")
	send := func(op string, m flashgate.Order, user string) bus.OrderReply {
		t.Helper()
		cmd := bus.OrderCommand{Op: op, SaleID: m.SaleID, OrderID: m.ID, UserID: user}
		if op == bus.CmdPay && user == "" {
			cmd = bus.PayCommand(flashgate.Payment{OrderID: m.ID, SaleID: m.SaleID, PaymentID: payID(m), AmountCents: 990 * m.Quantity})
		}
		r, err := bus.Command(ctx(t), s.nc, s.cfg.NATS, cmd)
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		return r
	}
	r := send(bus.CmdPay, paid, "")
	wantReply(t, "pay", r, bus.ReplyOK, "paid", "")
	if r.Quantity != 1 || r.ExpiresAt.UnixMilli() != paid.ExpiresAt.UnixMilli() {
		t.Fatalf("pay reply %+v", r)
	}
	wantReply(t, "cancel", send(bus.CmdCancel, canceled, "u2"), bus.ReplyOK, "canceled", flashgate.ReasonCanceled)
	wantReply(t, "cancel of a paid order", send(bus.CmdCancel, paid, "u1"), string(flashgate.CodeOrderClosed), "paid", "")
	wantReply(t, "pay of a canceled order", send(bus.CmdPay, canceled, ""), string(flashgate.CodeOrderClosed), "canceled", flashgate.ReasonCanceled)
	// A buyer's pay (as gateways before payments sent it) is malformed: only
	// a payment marks an order paid.
	wantReply(t, "a buyer's pay", send(bus.CmdPay, canceled, "u2"), string(flashgate.CodeInvalidRequest), "", "")
	wantReply(t, "bad op", send("refund", paid, "u1"), string(flashgate.CodeInvalidRequest), "", "")

	// Many at once: the backend answers them side by side.
	msgs := s.confirmedOrders(k, 6, 1, "", time.Now().Add(time.Minute), func(i int) string { return "c" + strconv.Itoa(i) })
	var wg sync.WaitGroup
	for _, m := range msgs {
		wg.Go(func() {
			r, err := bus.Command(ctx(t), s.nc, s.cfg.NATS, bus.PayCommand(flashgate.Payment{OrderID: m.ID, SaleID: m.SaleID, PaymentID: payID(m), AmountCents: 990}))
			if err != nil || r.Code != bus.ReplyOK {
				t.Errorf("pay %d: %+v, %v", m.ID, r, err)
			}
		})
	}
	wg.Wait()
	s.auditOK(sale.ID)

	// After shutdown nobody answers: the gateway's 503, never a "no".
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.b.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	cctx, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	if _, err := bus.Command(cctx, s.nc, s.cfg.NATS, bus.PayCommand(flashgate.Payment{OrderID: paid.ID, SaleID: sale.ID, PaymentID: payID(paid), AmountCents: 990})); err == nil {
		t.Fatal("a command was answered after shutdown")
	}
}
