// Package history checks what the clients of one sale saw against what the
// system ended with (docs/history.md). A chaos scenario records every call a
// client made — each purchase with its answer, each cancel, pay and read of an
// order — and, once the system has drained, reads the sale's final state: every
// MySQL order row, sales.sold, the Redis ledger, and the order messages still in
// the stream. Check then proves the promises of docs/design.md §2 from those two
// records alone, the way Jepsen's checkers do: a set check (every 202 is an
// order, and no order appears that no answer explains), a bank check (units are
// conserved between Redis, MySQL and the buyers), bounds (stock, per user, per
// purchase-limit subject), one order id per Idempotency-Key, and each order's
// status history as a linearizability model checked by porcupine.
//
// The checker knows nothing of how flashgate works inside: it reads answers and
// rows, so that a fix reverted anywhere shows up as an anomaly here.
package history

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/flashgate/flashgate"
)

// Kind is what a client asked.
type Kind string

const (
	// Purchase is POST /v1/sales/{sale}/orders.
	Purchase Kind = "purchase"
	// Cancel is POST …/orders/{order}/cancel, Pay POST …/orders/{order}/pay.
	Cancel Kind = "cancel"
	Pay    Kind = "pay"
	// Read is GET …/orders/{order}.
	Read Kind = "read"
)

// Op is one call of a client and its answer.
type Op struct {
	Kind Kind
	User string
	// Key is the purchase's Idempotency-Key ("" without one).
	Key      string
	Quantity int64
	Region   string
	// Order is the order id answered (a purchase's 202) or asked about
	// (cancel, pay, read).
	Order uint64
	// Status is the HTTP status; 0 means no answer came (a transport error or
	// a timeout): the call's outcome is unknown, and it may have taken effect.
	Status int
	// Code is the body's "code"; State the order status an order answer
	// carried (cancel, pay and read answered 200).
	Code  string
	State string
	// Call and Return bound the call in time (any clock of the recording
	// process, monotonic; nanoseconds). Zero Return: unknown (taken as "after
	// everything").
	Call, Return int64
}

// Unknown reports whether the call's outcome cannot be told from its answer:
// no answer at all, or a server error other than the documented 503 (which
// promises nothing was done).
func (o Op) Unknown() bool { return o.Status == 0 || (o.Status >= 500 && o.Status != 503) }

// Refused reports whether a purchase was answered with a refusal that
// promises nothing was reserved (every 4xx, and 503).
func (o Op) Refused() bool { return o.Status == 503 || (o.Status >= 400 && o.Status < 500) }

// Limits are the bounds a sale had from a moment on: the per-user limit and
// the purchase limits (by index, as orders' charges name them).
type Limits struct {
	// From is when these limits were asked for (a PATCH's call); the ones
	// before hold until Until (the PATCH's answer plus the time gateways take
	// to learn it), and in between an order may have met either.
	From, Until  time.Time
	PerUserLimit int64
	Limits       []flashgate.Limit
}

// Sale is what the checker needs of the sale's spec.
type Sale struct {
	ID    string
	Total int64
	// Regions are the units of each region (none: a sale without regions).
	Regions map[string]int64
	// Limits are the sale's limits over time, in order: the first from its
	// creation, one more per PATCH that changed them.
	Limits []Limits
}

// Final is what the system ended with, read once it drained.
type Final struct {
	// Orders are every MySQL row of the sale.
	Orders []flashgate.Order
	// Sold is sales.sold.
	Sold int64
	// RedisRemaining and RedisReserved are the Redis ledger (stock left, and
	// the units of reservations not yet decided).
	RedisRemaining, RedisReserved int64
	// InStream are the order ids of the sale's messages still in the orders
	// stream.
	InStream []uint64
}

// Allow are the costs a scenario documents and measures instead of failing
// on (docs/recovery.md names each one's price).
type Allow struct {
	// FailedAccepted: a 202 may end failed (a Redis failover without
	// wait_replicas); counted in Result.FailedAccepted.
	FailedAccepted bool
	// Unexplained: orders no client was told about are expected (the harness
	// lost the answers: say why where it is set); counted in
	// Result.Unexplained.
	Unexplained bool
}

// Anomaly kinds.
const (
	Lost           = "lost"           // a 202 with no order row
	FailedPromise  = "failed-202"     // a 202 whose order ended failed
	NotConfirmed   = "not-confirmed"  // a 202 whose order ended in a state that was never confirmed
	WrongOrder     = "wrong-order"    // a 202's row is another buyer's, sale's, quantity or region
	IDReused       = "id-reused"      // one order id answered to two buyers or keys
	KeyTwoOrders   = "key-two-orders" // one (user, key) answered or holding two order ids
	KeyRefused     = "key-refused"    // a replay of a key answered 202, refused as a new purchase would be
	RefusalBecame  = "refusal-became-order"
	Unexplained    = "unexplained-order" // an order no client was told about
	Oversold       = "oversold"
	OverUserLimit  = "over-user-limit"
	OverLimit      = "over-limit" // a purchase-limit subject beyond its max
	SoldCount      = "sold-count" // sales.sold is not the live units (a unit counted twice or not at all)
	Ledger         = "ledger"     // Redis remaining + reserved + sold != total
	StuckInStream  = "stuck-in-stream"
	Unsettled      = "unsettled" // a row still pending at rest
	StatusHistory  = "status-history"
	BadAnswer      = "bad-answer" // an answer that contradicts the protocol by itself (a 202 with no order id)
	UnknownCharges = "bad-charges"
	OrderOfNoSale  = "foreign-order"
)

// Anomaly is one broken promise.
type Anomaly struct {
	Kind   string
	Order  uint64
	User   string
	Detail string
}

func (a Anomaly) String() string {
	var b strings.Builder
	b.WriteString(a.Kind)
	if a.Order != 0 {
		fmt.Fprintf(&b, " order %d", a.Order)
	}
	if a.User != "" {
		fmt.Fprintf(&b, " user %s", a.User)
	}
	if a.Detail != "" {
		b.WriteString(": " + a.Detail)
	}
	return b.String()
}

// Result is what Check found for one sale.
type Result struct {
	Sale string
	// Operations counts the clients' calls, Orders the rows checked.
	Operations, Orders int
	// Accepted counts distinct order ids answered 202.
	Accepted int
	// FailedAccepted and Unexplained count what Allow let through.
	FailedAccepted, Unexplained int
	// InStreamDecided counts messages still in the stream at rest whose
	// orders MySQL has decided (redeliveries not yet acked).
	InStreamDecided int
	Anomalies       []Anomaly
}

// OK reports whether no anomaly was found.
func (r Result) OK() bool { return len(r.Anomalies) == 0 }

// Summary counts the anomalies by kind.
func (r Result) Summary() string {
	if r.OK() {
		return fmt.Sprintf("sale %s: %d operations, %d orders checked, 0 anomalies", r.Sale, r.Operations, r.Orders)
	}
	by := map[string]int{}
	for _, a := range r.Anomalies {
		by[a.Kind]++
	}
	kinds := make([]string, 0, len(by))
	for k := range by {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s %d", k, by[k])
	}
	return fmt.Sprintf("sale %s: %d operations, %d orders checked, %d anomalies (%s)", r.Sale, r.Operations, r.Orders,
		len(r.Anomalies), strings.Join(parts, ", "))
}

// Has reports whether an anomaly of kind was found.
func (r Result) Has(kind string) bool {
	return slices.ContainsFunc(r.Anomalies, func(a Anomaly) bool { return a.Kind == kind })
}

type checker struct {
	sale  Sale
	ops   []Op
	final Final
	allow Allow
	rows  map[uint64]*flashgate.Order
	res   Result
}

func (c *checker) add(kind string, order uint64, user, format string, a ...any) {
	c.res.Anomalies = append(c.res.Anomalies, Anomaly{Kind: kind, Order: order, User: user, Detail: fmt.Sprintf(format, a...)})
}

// Check proves the sale's promises from ops (every call of its clients, in any
// order) and final (the state at rest). The checks are independent: each one
// that fails adds its anomalies.
func Check(sale Sale, ops []Op, final Final, allow Allow) Result {
	c := &checker{sale: sale, ops: ops, final: final, allow: allow, rows: make(map[uint64]*flashgate.Order, len(final.Orders))}
	c.res.Sale, c.res.Operations, c.res.Orders = sale.ID, len(ops), len(final.Orders)
	for i := range final.Orders {
		o := &final.Orders[i]
		if o.SaleID != sale.ID {
			c.add(OrderOfNoSale, o.ID, o.UserID, "a row of sale %q among sale %s's", o.SaleID, sale.ID)
			continue
		}
		c.rows[o.ID] = o
	}
	accepted := c.checkAccepted()
	c.checkKeys()
	c.checkExplained(accepted)
	c.checkBounds()
	c.checkBank()
	c.checkStatusHistories()
	sort.SliceStable(c.res.Anomalies, func(i, j int) bool { return c.res.Anomalies[i].Kind < c.res.Anomalies[j].Kind })
	return c.res
}

// checkAccepted is the set check's first half: every order id answered 202 is
// one row, of that buyer, of that purchase, confirmed at some point (now
// confirmed, paid, or canceled by its buyer or its expiry), and one id is
// never answered to two buyers or two keys. It returns the ids answered 202.
func (c *checker) checkAccepted() map[uint64]bool {
	type owner struct{ user, key string }
	owners := map[uint64]owner{}
	accepted := map[uint64]bool{}
	for _, op := range c.ops {
		if op.Kind != Purchase || op.Status != 202 {
			continue
		}
		if op.Order == 0 {
			c.add(BadAnswer, 0, op.User, "a 202 without an order id")
			continue
		}
		accepted[op.Order] = true
		w := owner{op.User, op.Key}
		if prev, ok := owners[op.Order]; ok {
			if prev != w {
				c.add(IDReused, op.Order, op.User, "answered to %s (key %q) and to %s (key %q)", prev.user, prev.key, op.User, op.Key)
			}
			continue
		}
		owners[op.Order] = w
		o, ok := c.rows[op.Order]
		if !ok {
			c.add(Lost, op.Order, op.User, "answered 202, no order row")
			continue
		}
		qty := max(op.Quantity, 1)
		if o.UserID != op.User || o.Quantity != qty || o.Region != op.Region {
			c.add(WrongOrder, op.Order, op.User, "asked %d of region %q, the row is %s's %d of region %q", qty, op.Region, o.UserID, o.Quantity, o.Region)
		}
		switch {
		case o.Status == flashgate.OrderFailed:
			if c.allow.FailedAccepted {
				c.res.FailedAccepted++
			} else {
				c.add(FailedPromise, o.ID, o.UserID, "answered 202, ended failed (%s)", o.Reason)
			}
		case o.Status == flashgate.OrderCanceled && o.Reason != flashgate.ReasonCanceled && o.Reason != flashgate.ReasonExpired:
			c.add(NotConfirmed, o.ID, o.UserID, "answered 202, ended canceled for %q", o.Reason)
		case o.Status == flashgate.OrderPending || o.Status == flashgate.OrderProcessing:
			// Reported by checkBounds for every row.
		case o.Status != flashgate.OrderConfirmed && o.Status != flashgate.OrderPaid && o.Status != flashgate.OrderCanceled:
			c.add(NotConfirmed, o.ID, o.UserID, "answered 202, ended %s", o.Status)
		}
	}
	c.res.Accepted = len(accepted)
	return accepted
}

// checkKeys: one (user, Idempotency-Key), one order id — among the answers and
// among the rows (a row of a key is one its buyer was answered, if any was).
func (c *checker) checkKeys() {
	type uk struct{ user, key string }
	answered := map[uk]uint64{}
	for _, op := range c.ops {
		if op.Kind != Purchase || op.Status != 202 || op.Key == "" || op.Order == 0 {
			continue
		}
		k := uk{op.User, op.Key}
		if prev, ok := answered[k]; ok && prev != op.Order {
			c.add(KeyTwoOrders, op.Order, op.User, "key %q answered %d and %d", op.Key, prev, op.Order)
			continue
		}
		answered[k] = op.Order
	}
	// A replay is answered with the key's order however often it comes: a
	// call of a key made after the key was answered 202, refused as a new
	// purchase would be (sold out, over a limit), ran the admission again.
	first := map[uk]int64{} // the earliest answer of a 202 of each key
	for _, op := range c.ops {
		if op.Kind != Purchase || op.Status != 202 || op.Key == "" {
			continue
		}
		k := uk{op.User, op.Key}
		if t, ok := first[k]; !ok || op.Return < t {
			first[k] = op.Return
		}
	}
	for _, op := range c.ops {
		if op.Kind != Purchase || op.Key == "" || (op.Code != string(flashgate.CodeSoldOut) && op.Code != string(flashgate.CodeLimitReached)) {
			continue
		}
		k := uk{op.User, op.Key}
		if t, ok := first[k]; ok && op.Call > t {
			c.add(KeyRefused, answered[k], op.User, "key %q was answered 202 (order %d), a later replay %d %s", op.Key, answered[k], op.Status, op.Code)
		}
	}
	rows := map[uk]uint64{}
	for _, o := range c.sortedRows() {
		if o.IdemKey == "" {
			continue
		}
		k := uk{o.UserID, o.IdemKey}
		if prev, ok := rows[k]; ok {
			c.add(KeyTwoOrders, o.ID, o.UserID, "key %q holds orders %d and %d", o.IdemKey, prev, o.ID)
			continue
		}
		rows[k] = o.ID
		if a, ok := answered[k]; ok && a != o.ID {
			c.add(KeyTwoOrders, o.ID, o.UserID, "key %q was answered %d, its row is %d", o.IdemKey, a, o.ID)
		}
	}
}

// checkExplained is the set check's second half: every row is explained by
// a 202 of its id, or by a call of its buyer whose outcome is unknown (no
// answer: it may have been admitted), each such call explaining one row (of
// its key, when it sent one). A row left over is a refusal that became an
// order when its buyer was refused, or else an order nobody was told about.
func (c *checker) checkExplained(accepted map[uint64]bool) {
	type uk struct{ user, key string }
	unknown := map[uk]int{}
	refused := map[string][]string{}
	for _, op := range c.ops {
		if op.Kind != Purchase {
			continue
		}
		switch {
		case op.Unknown():
			unknown[uk{op.User, op.Key}]++
		case op.Refused():
			refused[op.User] = append(refused[op.User], fmt.Sprintf("%d %s", op.Status, op.Code))
		}
	}
	for _, o := range c.sortedRows() {
		if accepted[o.ID] {
			continue
		}
		// A failed row holds nothing and promises nothing (its units went
		// back): only its existence from a refusal matters, below.
		k := uk{o.UserID, o.IdemKey}
		if unknown[k] > 0 {
			unknown[k]--
			continue
		}
		switch {
		case len(refused[o.UserID]) > 0:
			c.add(RefusalBecame, o.ID, o.UserID, "no 202 named it (status %s, key %q), and its buyer was refused: %s", o.Status, o.IdemKey, strings.Join(refused[o.UserID], ", "))
		case c.allow.Unexplained:
			c.res.Unexplained++
		default:
			c.add(Unexplained, o.ID, o.UserID, "no client was told of it (status %s, key %q)", o.Status, o.IdemKey)
		}
	}
}

func (c *checker) sortedRows() []*flashgate.Order {
	out := make([]*flashgate.Order, 0, len(c.rows))
	for _, o := range c.rows {
		out = append(out, o)
	}
	slices.SortFunc(out, func(a, b *flashgate.Order) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

func live(o *flashgate.Order) bool {
	return o.Status == flashgate.OrderConfirmed || o.Status == flashgate.OrderPaid
}

// checkBounds: the live units within the total and each region's, each
// buyer's within the per-user limit, each purchase-limit subject's within its
// max; and nothing left pending at rest.
func (c *checker) checkBounds() {
	var units int64
	regions := map[string]int64{}
	for _, o := range c.sortedRows() {
		if o.Status == flashgate.OrderPending || o.Status == flashgate.OrderProcessing {
			c.add(Unsettled, o.ID, o.UserID, "still %s at rest", o.Status)
		}
		if !live(o) {
			continue
		}
		units += o.Quantity
		regions[o.Region] += o.Quantity
	}
	if units > c.sale.Total {
		c.add(Oversold, 0, "", "%d live units of %d", units, c.sale.Total)
	}
	for r, n := range regions {
		if len(c.sale.Regions) == 0 {
			continue
		}
		if t, ok := c.sale.Regions[r]; !ok || n > t {
			c.add(Oversold, 0, "", "region %q: %d live units of %d", r, n, t)
		}
	}
	c.checkUserLimits()
	c.checkPurchaseLimits()
}

// limitAt is the loosest per-user limit and purchase limits an order created
// at t may have met: the ones in force then, and around a change both.
func (c *checker) limitAt(t time.Time) (perUser int64, limits []flashgate.Limit) {
	for i, l := range c.sale.Limits {
		in := i == len(c.sale.Limits)-1 || t.Before(c.sale.Limits[i+1].Until)
		if i > 0 && t.Before(l.From) {
			in = false
		}
		if !in {
			continue
		}
		perUser = max(perUser, l.PerUserLimit)
		if limits == nil {
			limits = slices.Clone(l.Limits)
			continue
		}
		for j := range min(len(limits), len(l.Limits)) {
			limits[j].Max = max(limits[j].Max, l.Limits[j].Max)
		}
	}
	return perUser, limits
}

// checkUserLimits: each buyer's live units, at the admission of each of
// their live orders (counting those admitted before it), within the limit
// that order met. With one limit all along that is: the buyer's live units
// within it.
func (c *checker) checkUserLimits() {
	by := map[string][]*flashgate.Order{}
	for _, o := range c.sortedRows() {
		if live(o) {
			by[o.UserID] = append(by[o.UserID], o)
		}
	}
	for user, os := range by {
		slices.SortStableFunc(os, func(a, b *flashgate.Order) int { return a.CreatedAt.Compare(b.CreatedAt) })
		var held int64
		for _, o := range os {
			held += o.Quantity
			if lim, _ := c.limitAt(o.CreatedAt); lim > 0 && held > lim {
				c.add(OverUserLimit, o.ID, user, "%d live units with this order, limit %d", held, lim)
				break
			}
		}
	}
}

// checkPurchaseLimits: what the live orders charge each (limit, window,
// subject) within the limit's max as the charging order met it.
func (c *checker) checkPurchaseLimits() {
	type key struct {
		lim             int
		window, subject string
	}
	used := map[key]int64{}
	var rows []*flashgate.Order
	for _, o := range c.sortedRows() {
		if live(o) && o.Charges != "" {
			rows = append(rows, o)
		}
	}
	slices.SortStableFunc(rows, func(a, b *flashgate.Order) int { return a.CreatedAt.Compare(b.CreatedAt) })
	reported := map[key]bool{}
	for _, o := range rows {
		cs, err := flashgate.ParseCharges(o.Charges)
		if err != nil {
			c.add(UnknownCharges, o.ID, o.UserID, "charges %q: %v", o.Charges, err)
			continue
		}
		_, limits := c.limitAt(o.CreatedAt)
		for _, ch := range cs {
			k := key{ch.Limit, ch.Window, ch.Subject}
			used[k] += ch.Inc
			if ch.Limit >= len(limits) {
				c.add(UnknownCharges, o.ID, o.UserID, "a charge of limit %d, the sale has %d", ch.Limit, len(limits))
				continue
			}
			if used[k] > limits[ch.Limit].Max && !reported[k] {
				reported[k] = true
				c.add(OverLimit, o.ID, o.UserID, "%s %q (window %q): %d with this order, max %d", limits[ch.Limit].Dimension, ch.Subject, ch.Window, used[k], limits[ch.Limit].Max)
			}
		}
	}
}

// checkBank is the bank check: units are neither made nor lost between the
// accounts. MySQL's sales.sold is its live orders' units, and Redis's stock
// left plus its open reservations plus MySQL's sold is the total. And nothing
// waits in the stream at rest.
func (c *checker) checkBank() {
	var units int64
	for _, o := range c.rows {
		if live(o) {
			units += o.Quantity
		}
	}
	if c.final.Sold != units {
		c.add(SoldCount, 0, "", "sales.sold %d, live units %d", c.final.Sold, units)
	}
	if d := c.final.RedisRemaining + c.final.RedisReserved + c.final.Sold - c.sale.Total; d != 0 {
		c.add(Ledger, 0, "", "redis remaining %d + reserved %d + sold %d - total %d = %d",
			c.final.RedisRemaining, c.final.RedisReserved, c.final.Sold, c.sale.Total, d)
	}
	// A message of an order MySQL has decided is a redelivery the consumer
	// will ack (its server-side back-off can hold it minutes): counted, not
	// an anomaly. One of an order MySQL has not decided waits.
	for _, id := range c.final.InStream {
		o, ok := c.rows[id]
		if ok && o.Status != flashgate.OrderPending && o.Status != flashgate.OrderProcessing {
			c.res.InStreamDecided++
			continue
		}
		u := ""
		if ok {
			u = o.UserID
		}
		c.add(StuckInStream, id, u, "its message is still in the orders stream at rest, the order undecided")
	}
}
