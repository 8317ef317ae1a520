package history

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
)

// A hand-made sale: 10 units, 1 per user, at most 2 units per phone.
var (
	t0   = time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	sale = Sale{ID: "s1", Total: 10, Limits: []Limits{{PerUserLimit: 1,
		Limits: []flashgate.Limit{{Dimension: flashgate.DimPhone, Max: 2, Of: flashgate.OfUnits, Per: flashgate.PerSale}}}}}
)

func row(id uint64, user string, st flashgate.OrderStatus, reason string) flashgate.Order {
	return flashgate.Order{ID: id, SaleID: "s1", UserID: user, Quantity: 1, Status: st, Reason: reason,
		CreatedAt: t0.Add(time.Duration(id) * time.Millisecond)}
}

func bought(user string, id uint64, at int64) Op {
	return Op{Kind: Purchase, User: user, Quantity: 1, Order: id, Status: 202, Code: "accepted", Call: at, Return: at + 1}
}

func refused(user string, status int, code string, at int64) Op {
	return Op{Kind: Purchase, User: user, Quantity: 1, Status: status, Code: code, Call: at, Return: at + 1}
}

// good is a healthy history: three buyers, one canceled, one paid, one
// expired, a refusal, an unanswered call that did not take.
func good() ([]Op, Final) {
	ops := []Op{
		bought("a", 1, 10), bought("b", 2, 11), bought("c", 3, 12),
		refused("a", 403, "limit_reached", 20), refused("d", 503, "unavailable", 21),
		// A key refused first, then admitted: no replay was refused.
		{Kind: Purchase, User: "f", Key: "kf", Quantity: 1, Status: 409, Code: "sold_out", Call: 23, Return: 24},
		{Kind: Purchase, User: "e", Quantity: 1, Status: 0, Call: 22}, // no answer, no row
		{Kind: Cancel, User: "a", Order: 1, Status: 200, State: sCanceled, Call: 30, Return: 31},
		{Kind: Pay, User: "b", Order: 2, Status: 200, State: sPaid, Call: 30, Return: 32},
		{Kind: Read, User: "c", Order: 3, Status: 200, State: sConfirmed, Call: 33, Return: 34},
		{Kind: Pay, User: "c", Order: 3, Status: 409, Code: "order_closed", Call: 50, Return: 51},
	}
	f := Final{Orders: []flashgate.Order{
		row(1, "a", flashgate.OrderCanceled, flashgate.ReasonCanceled),
		row(2, "b", flashgate.OrderPaid, ""),
		row(3, "c", flashgate.OrderCanceled, flashgate.ReasonExpired),
	}, Sold: 1, RedisRemaining: 9}
	return ops, f
}

func TestHealthyHistoryHasNoAnomaly(t *testing.T) {
	ops, f := good()
	r := Check(sale, ops, f, Allow{})
	if !r.OK() {
		t.Fatalf("anomalies in a healthy history: %v", r.Anomalies)
	}
	if r.Operations != len(ops) || r.Orders != 3 || r.Accepted != 3 {
		t.Errorf("counted %d operations, %d orders, %d accepted; want %d, 3, 3", r.Operations, r.Orders, r.Accepted, len(ops))
	}
	if !strings.HasSuffix(r.Summary(), "0 anomalies") {
		t.Errorf("summary %q", r.Summary())
	}
}

// Each bad history breaks one promise; the checker must name it.
func TestEveryAnomalyIsReported(t *testing.T) {
	cases := []struct {
		name   string
		kind   string
		break_ func(ops *[]Op, f *Final, s *Sale)
	}{
		{"a 202 with no row", Lost, func(ops *[]Op, f *Final, _ *Sale) {
			*ops = append(*ops, bought("x", 99, 40))
		}},
		{"a 202 ended failed", FailedPromise, func(_ *[]Op, f *Final, _ *Sale) {
			f.Orders[1] = row(2, "b", flashgate.OrderFailed, flashgate.ReasonLimitReached)
		}},
		{"a 202 canceled for another reason than its buyer or expiry", NotConfirmed, func(_ *[]Op, f *Final, _ *Sale) {
			f.Orders[2] = row(3, "c", flashgate.OrderCanceled, "whatever")
		}},
		{"a 202's row is another buyer's", WrongOrder, func(_ *[]Op, f *Final, _ *Sale) {
			f.Orders[1].UserID = "mallory"
		}},
		{"one id answered to two buyers", IDReused, func(ops *[]Op, _ *Final, _ *Sale) {
			*ops = append(*ops, bought("z", 2, 40))
		}},
		{"one key answered two ids", KeyTwoOrders, func(ops *[]Op, f *Final, _ *Sale) {
			a, b := bought("k", 7, 40), bought("k", 8, 41)
			a.Key, b.Key = "key1", "key1"
			*ops = append(*ops, a, b)
			f.Orders = append(f.Orders, row(7, "k", flashgate.OrderConfirmed, ""), row(8, "k", flashgate.OrderFailed, "sold_out"))
			f.Sold++
			f.RedisRemaining--
		}},
		{"one key holding two rows", KeyTwoOrders, func(ops *[]Op, f *Final, _ *Sale) {
			a := bought("k", 7, 40)
			a.Key = "key1"
			u := Op{Kind: Purchase, User: "k", Key: "key1", Quantity: 1, Call: 42}
			*ops = append(*ops, a, u)
			r7, r8 := row(7, "k", flashgate.OrderConfirmed, ""), row(8, "k", flashgate.OrderFailed, "sold_out")
			r7.IdemKey, r8.IdemKey = "key1", "key1"
			f.Orders = append(f.Orders, r7, r8)
			f.Sold++
			f.RedisRemaining--
		}},
		{"a replay of a key refused sold out", KeyRefused, func(ops *[]Op, _ *Final, _ *Sale) {
			(*ops)[1].Key = "kb"
			replay := refused("b", 409, "sold_out", 40)
			replay.Key = "kb"
			*ops = append(*ops, replay)
		}},
		{"a 503 became an order", RefusalBecame, func(_ *[]Op, f *Final, _ *Sale) {
			f.Orders = append(f.Orders, row(9, "d", flashgate.OrderConfirmed, ""))
			f.Sold++
			f.RedisRemaining--
		}},
		{"a 403 became a second order", RefusalBecame, func(_ *[]Op, f *Final, _ *Sale) {
			f.Orders = append(f.Orders, row(9, "a", flashgate.OrderFailed, "limit_reached"))
		}},
		{"an order nobody asked for", Unexplained, func(_ *[]Op, f *Final, _ *Sale) {
			f.Orders = append(f.Orders, row(9, "ghost", flashgate.OrderConfirmed, ""))
			f.Sold++
			f.RedisRemaining--
		}},
		{"oversold", Oversold, func(_ *[]Op, _ *Final, s *Sale) { s.Total = 0 }},
		{"a region oversold", Oversold, func(ops *[]Op, f *Final, s *Sale) {
			s.Regions = map[string]int64{"bj": 5, "sh": 5}
			for i := range *ops {
				(*ops)[i].Region = "bj"
			}
			for i := range f.Orders {
				f.Orders[i].Region = "bj"
			}
			s.Regions["bj"] = 0
		}},
		{"a buyer over the limit", OverUserLimit, func(ops *[]Op, f *Final, _ *Sale) {
			*ops = append(*ops, bought("b", 9, 40))
			f.Orders = append(f.Orders, row(9, "b", flashgate.OrderConfirmed, ""))
			f.Sold++
			f.RedisRemaining--
		}},
		{"a phone over its limit", OverLimit, func(ops *[]Op, f *Final, _ *Sale) {
			for i, u := range []string{"p", "q", "r"} {
				id := uint64(20 + i)
				*ops = append(*ops, bought(u, id, int64(40+i)))
				o := row(id, u, flashgate.OrderConfirmed, "")
				o.Charges = flashgate.EncodeCharges([]flashgate.Charge{{Limit: 0, Window: flashgate.PerSale, Subject: "+15550001", Inc: 1}})
				f.Orders = append(f.Orders, o)
				f.Sold++
				f.RedisRemaining--
			}
		}},
		{"sales.sold counts a unit twice", SoldCount, func(_ *[]Op, f *Final, _ *Sale) {
			f.Sold++
			f.RedisRemaining--
		}},
		{"redis counts a canceled unit back twice", Ledger, func(_ *[]Op, f *Final, _ *Sale) {
			f.RedisRemaining++
		}},
		{"a message stuck in the stream", StuckInStream, func(ops *[]Op, f *Final, _ *Sale) {
			*ops = append(*ops, bought("w", 30, 40))
			f.Orders = append(f.Orders, row(30, "w", flashgate.OrderPending, ""))
			f.InStream = []uint64{2, 30}
		}},
		{"a row pending at rest", Unsettled, func(_ *[]Op, f *Final, _ *Sale) {
			f.Orders[1] = row(2, "b", flashgate.OrderPending, "")
		}},
		{"a paid order ends canceled", StatusHistory, func(_ *[]Op, f *Final, _ *Sale) {
			f.Orders[1] = row(2, "b", flashgate.OrderCanceled, flashgate.ReasonExpired)
		}},
		{"a cancel answered 200, the order ends paid", StatusHistory, func(ops *[]Op, f *Final, _ *Sale) {
			*ops = append(*ops, Op{Kind: Cancel, User: "b", Order: 2, Status: 200, State: sCanceled, Call: 40, Return: 41})
		}},
		{"a read of confirmed after the order was canceled", StatusHistory, func(ops *[]Op, _ *Final, _ *Sale) {
			*ops = append(*ops, Op{Kind: Read, User: "a", Order: 1, Status: 200, State: sConfirmed, Call: 40, Return: 41})
		}},
		{"a 202 without an order id", BadAnswer, func(ops *[]Op, _ *Final, _ *Sale) {
			*ops = append(*ops, bought("y", 0, 40))
		}},
		{"a row of another sale", OrderOfNoSale, func(_ *[]Op, f *Final, _ *Sale) {
			o := row(50, "a", flashgate.OrderConfirmed, "")
			o.SaleID = "s2"
			f.Orders = append(f.Orders, o)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ops, f := good()
			s := sale
			s.Limits = append([]Limits(nil), sale.Limits...)
			tc.break_(&ops, &f, &s)
			r := Check(s, ops, f, Allow{})
			if !r.Has(tc.kind) {
				t.Fatalf("want a %s anomaly, got %v", tc.kind, r.Anomalies)
			}
			if r.OK() || !strings.Contains(r.Summary(), tc.kind) {
				t.Errorf("summary %q does not name %s", r.Summary(), tc.kind)
			}
		})
	}
}

// A message of a decided order still in the stream is a redelivery on its
// way: counted, not an anomaly.
func TestDecidedMessageInStream(t *testing.T) {
	ops, f := good()
	f.InStream = []uint64{1, 2}
	r := Check(sale, ops, f, Allow{})
	if !r.OK() || r.InStreamDecided != 2 {
		t.Fatalf("decided orders' messages in the stream: %v, counted %d", r.Anomalies, r.InStreamDecided)
	}
}

// An unanswered call may have been admitted: its row is explained, once.
func TestUnknownOutcomeExplainsOneOrder(t *testing.T) {
	ops, f := good()
	f.Orders = append(f.Orders, row(9, "e", flashgate.OrderConfirmed, ""))
	f.Sold++
	f.RedisRemaining--
	if r := Check(sale, ops, f, Allow{}); !r.OK() {
		t.Fatalf("a row of an unanswered call: %v", r.Anomalies)
	}
	f.Orders = append(f.Orders, row(10, "e", flashgate.OrderFailed, "limit_reached"))
	if r := Check(sale, ops, f, Allow{}); !r.Has(Unexplained) {
		t.Fatalf("two rows for one unanswered call: want %s, got %v", Unexplained, r.Anomalies)
	}
}

// What Allow lets through is counted, not reported.
func TestAllowCountsInstead(t *testing.T) {
	ops, f := good()
	f.Orders[1] = row(2, "b", flashgate.OrderFailed, flashgate.ReasonSoldOut)
	// b's pay is gone with the failover.
	ops = slices.DeleteFunc(ops, func(op Op) bool { return op.Kind == Pay && op.User == "b" })
	f.Orders = append(f.Orders, row(9, "ghost", flashgate.OrderConfirmed, ""))
	// The ghost holds the unit b's failed order gave back.
	r := Check(sale, ops, f, Allow{FailedAccepted: true, Unexplained: true})
	if !r.OK() || r.FailedAccepted != 1 || r.Unexplained != 1 {
		t.Fatalf("allowed: %v, failed %d, unexplained %d", r.Anomalies, r.FailedAccepted, r.Unexplained)
	}
}

// A PATCH: orders admitted before a lowering are within the limit they met;
// one admitted after it beyond the new one is reported, and around the change
// the looser limit counts.
func TestLimitsOverTime(t *testing.T) {
	s := Sale{ID: "s1", Total: 10, Limits: []Limits{
		{PerUserLimit: 2},
		{From: t0.Add(100 * time.Millisecond), Until: t0.Add(200 * time.Millisecond), PerUserLimit: 1},
	}}
	two := func(second time.Duration) ([]Op, Final) {
		a, b := row(1, "a", flashgate.OrderConfirmed, ""), row(2, "a", flashgate.OrderConfirmed, "")
		a.CreatedAt, b.CreatedAt = t0, t0.Add(second)
		return []Op{bought("a", 1, 1), bought("a", 2, 2)}, Final{Orders: []flashgate.Order{a, b}, Sold: 2, RedisRemaining: 8}
	}
	for _, tc := range []struct {
		second time.Duration
		bad    bool
	}{{50 * time.Millisecond, false}, {150 * time.Millisecond, false}, {250 * time.Millisecond, true}} {
		ops, f := two(tc.second)
		if r := Check(s, ops, f, Allow{}); r.Has(OverUserLimit) != tc.bad {
			t.Errorf("second order %v after the first: over-user-limit %t, want %t (%v)", tc.second, r.Has(OverUserLimit), tc.bad, r.Anomalies)
		}
	}
}

// An unanswered cancel may or may not have acted: both ends are a life.
func TestUnknownCancelEitherWay(t *testing.T) {
	for _, end := range []flashgate.OrderStatus{flashgate.OrderConfirmed, flashgate.OrderCanceled} {
		ops := []Op{bought("a", 1, 1), {Kind: Cancel, User: "a", Order: 1, Status: 503, Code: "unavailable", Call: 5, Return: 6}}
		f := Final{Orders: []flashgate.Order{row(1, "a", end, flashgate.ReasonCanceled)}, RedisRemaining: 10}
		if end == flashgate.OrderConfirmed {
			f.Sold, f.RedisRemaining = 1, 9
		}
		if r := Check(sale, ops, f, Allow{}); !r.OK() {
			t.Errorf("ending %s after a 503 cancel: %v", end, r.Anomalies)
		}
	}
}
