package backend

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/testenv"
)

// TestPaymentRecorded: a payment is recorded with the order, in MySQL, by the
// transaction that marks it paid; what contradicts the order or an earlier
// payment is refused and changes nothing; a late payment is closed and takes
// no unit back.
func TestPaymentRecorded(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	sale := spec(10, 2, nil) // 990 cents a unit
	k := s.lifecycleSale(sale)
	ok := bus.ReplyOK
	payment := func(id uint64) (string, int64) {
		t.Helper()
		var pid string
		var amount int64
		if err := s.db.QueryRowContext(ctx(t), `SELECT COALESCE(payment_id, ''), COALESCE(amount_cents, 0) FROM orders WHERE id = ?`, id).Scan(&pid, &amount); err != nil {
			t.Fatal(err)
		}
		return pid, amount
	}

	m := s.confirmed(k, "u1", 2, "")
	// Not price × quantity: refused, the order stays payable.
	for _, amount := range []int64{990, 1979, 1981, 0} {
		wantReply(t, "a wrong amount", s.pay(m, "pi_a", amount), string(flashgate.CodeAmountMismatch), "confirmed", "")
	}
	if st, _, _ := s.order(m.ID); st != "confirmed" {
		t.Fatalf("after wrong amounts: %s", st)
	}
	if pid, _ := payment(m.ID); pid != "" {
		t.Fatalf("a refused payment was recorded: %q", pid)
	}
	// The right amount pays it, and the row keeps the payment.
	wantReply(t, "pay", s.pay(m, "pi_a", 1980), ok, "paid", "")
	if pid, amount := payment(m.ID); pid != "pi_a" || amount != 1980 {
		t.Fatalf("recorded payment %q %d", pid, amount)
	}
	// The same payment again: the same answer, nothing written.
	wantReply(t, "the same payment again", s.pay(m, "pi_a", 1980), ok, "paid", "")
	// Another payment of the paid order; the same id with another amount.
	wantReply(t, "another payment", s.pay(m, "pi_b", 1980), string(flashgate.CodeAlreadyPaid), "paid", "")
	wantReply(t, "the same id, another amount", s.pay(m, "pi_a", 1000), string(flashgate.CodeAmountMismatch), "paid", "")
	if pid, amount := payment(m.ID); pid != "pi_a" || amount != 1980 {
		t.Fatalf("the payment changed: %q %d", pid, amount)
	}
	// One payment cannot pay two orders.
	m2 := s.confirmed(k, "u2", 1, "")
	wantReply(t, "a used payment id", s.pay(m2, "pi_a", 990), string(flashgate.CodePaymentIDUsed), "confirmed", "")
	wantReply(t, "its own payment", s.pay(m2, "pi_c", 990), ok, "paid", "")

	// Late: canceled by its buyer, or past its deadline. Closed; the units
	// the cancel or the expiry gave back stay back (and the buyer's quota
	// the cancel kept stays kept).
	canceled := s.confirmed(k, "u3", 1, "")
	wantReply(t, "cancel", s.command(bus.CmdCancel, canceled, "u3"), ok, "canceled", flashgate.ReasonCanceled)
	expired := s.confirmedOrders(k, 1, 1, "", time.Now().Add(-time.Second), func(int) string { return "u4" })[0]
	sold, left := s.sold(sale.ID), remaining(t, s.rc, k, "")
	wantReply(t, "late, canceled", s.pay(canceled, "pi_d", 990), string(flashgate.CodeOrderClosed), "canceled", flashgate.ReasonCanceled)
	wantReply(t, "late, expired", s.pay(expired, "pi_e", 990), string(flashgate.CodeOrderClosed), "canceled", flashgate.ReasonExpired)
	if s.sold(sale.ID) != sold-1 || remaining(t, s.rc, k, "") != left+1 || s.units(sale.ID, "u3") != 1 || s.units(sale.ID, "u4") != 0 {
		t.Fatalf("sold %d→%d, remaining %d→%d: a late payment took units back", sold, s.sold(sale.ID), left, remaining(t, s.rc, k, ""))
	}
	for _, o := range []flashgate.Order{canceled, expired} {
		if pid, _ := payment(o.ID); pid != "" {
			t.Fatalf("a late payment was recorded on %d: %q", o.ID, pid)
		}
	}
	s.auditOK(sale.ID)
}

// TestPaymentsOfOneOrderRace: payments of one order at once, some repeating
// one payment_id, others each their own: exactly one payment is recorded, its
// every copy answers ok, and every other payment answers already_paid.
func TestPaymentsOfOneOrderRace(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	sale := spec(10, 1, nil)
	k := s.lifecycleSale(sale)
	for round := range 3 {
		m := s.confirmed(k, "u"+strconv.Itoa(round), 1, "")
		ids := []string{"pi_same", "pi_same", "pi_same", "pi_a", "pi_b", "pi_c"}
		for i := range ids {
			ids[i] += "_" + strconv.Itoa(round)
		}
		replies := make([]bus.OrderReply, len(ids))
		var wg sync.WaitGroup
		for i, id := range ids {
			wg.Go(func() { replies[i] = s.pay(m, id, 990) })
		}
		wg.Wait()
		var recorded string
		if err := s.db.QueryRowContext(ctx(t), `SELECT payment_id FROM orders WHERE id = ?`, m.ID).Scan(&recorded); err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			want := string(flashgate.CodeAlreadyPaid)
			if id == recorded {
				want = bus.ReplyOK
			}
			if replies[i].Code != want || replies[i].Status != "paid" {
				t.Errorf("round %d: payment %s (recorded %s) answered %+v, want %s", round, id, recorded, replies[i], want)
			}
		}
	}
	s.auditOK(sale.ID)
}
