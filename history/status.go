package history

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/flashgate/flashgate"
)

// An order's status history as a sequential specification, checked by
// porcupine: the calls on one order (its purchase and every replay, each
// cancel, pay and read) and its row at rest must be linearizable against it.
// The backend moves an order by itself too — confirms or fails a pending one,
// expires a confirmed one unpaid — so each step first lets the order take any
// of those moves (the model is nondeterministic), then asks whether the call
// could have answered what it did.
//
// The states are the public statuses, with expiry told apart from the
// buyer's cancel (both are "canceled" on the wire, the reason differs).
const (
	sNone      = ""
	sPending   = "pending"
	sConfirmed = "confirmed"
	sPaid      = "paid"
	sCanceled  = "canceled"
	sExpired   = "expired"
	sFailed    = "failed"
)

// spontaneous is where the system may move an order without a client's
// call: the writer confirms or fails it, the sweep expires it unpaid.
var spontaneous = map[string][]string{
	sPending:   {sConfirmed, sFailed, sExpired},
	sConfirmed: {sExpired},
}

func closure(s string) []string {
	out := []string{s}
	for i := 0; i < len(out); i++ {
		for _, n := range spontaneous[out[i]] {
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	return out
}

// statusIn is a step's call; final marks the read of the row at rest.
type statusIn struct {
	kind  Kind
	final bool
}

// statusOut is its answer.
type statusOut struct {
	status int
	code   string
	state  string
}

// stepFrom is the states a call answered out may leave an order in, from s
// (nil: it could not have answered that from s).
func stepFrom(s string, in statusIn, out statusOut) []string {
	if in.final {
		if s == out.state {
			return []string{s}
		}
		return nil
	}
	// No answer, or a server error: the call may or may not have acted.
	unknown := out.status == 0 || out.status >= 500
	switch in.kind {
	case Purchase:
		// Only a 202 names the order: the first creates it, a replay finds it.
		if s == sNone {
			return []string{sPending}
		}
		return []string{s}
	case Read:
		switch {
		case unknown:
			return []string{s}
		case out.status == 200:
			if s == out.state {
				return []string{s}
			}
		case out.status == 404:
			// Not yet in MySQL while Redis lost its record: still pending.
			if s == sPending {
				return []string{s}
			}
		}
		return nil
	case Cancel, Pay:
		done := sCanceled
		if in.kind == Pay {
			done = sPaid
		}
		switch {
		case unknown:
			if s == sConfirmed {
				return []string{s, done}
			}
			return []string{s}
		case out.status == 200:
			// A repeat of what is done is answered as done.
			if (s == sConfirmed || s == done) && out.state == done {
				return []string{done}
			}
		case out.status == 409 && out.code == string(flashgate.CodeOrderClosed):
			if s == sPaid || s == sCanceled || s == sExpired || s == sFailed {
				if s != done {
					return []string{s}
				}
			}
		case out.status == 409 || out.status == 404:
			// Still being confirmed (or not yet known to MySQL).
			if s == sPending {
				return []string{s}
			}
		case out.status == 400 || out.status == 429:
			return []string{s}
		case in.kind == Pay && out.status == 403 && out.code == string(flashgate.CodeForbidden):
			// A buyer's pay: only the payment service marks an order paid
			// (POST /v1/payments); the order is left as it was.
			return []string{s}
		}
		return nil
	}
	return nil
}

var statusModel = (&porcupine.NondeterministicModel{
	Init: func() []interface{} { return []interface{}{sNone} },
	Step: func(state, input, output interface{}) []interface{} {
		var next []interface{}
		for _, s := range closure(state.(string)) {
			for _, n := range stepFrom(s, input.(statusIn), output.(statusOut)) {
				if !slices.Contains(next, interface{}(n)) {
					next = append(next, n)
				}
			}
		}
		return next
	},
	DescribeOperation: func(input, output interface{}) string {
		in, out := input.(statusIn), output.(statusOut)
		if in.final {
			return "at rest → " + out.state
		}
		return fmt.Sprintf("%s → %d %s %s", in.kind, out.status, out.code, out.state)
	},
}).ToModel()

// statusTimeout bounds porcupine's search per order; a history of one order
// is a handful of calls, so it never comes near.
const statusTimeout = 10 * time.Second

// State is the state an order answer (or row) of status and reason stands
// for in Op.State: its status, with an expired order told apart from one its
// buyer canceled.
func State(status flashgate.OrderStatus, reason string) string { return publicState(status, reason) }

func publicState(status flashgate.OrderStatus, reason string) string {
	switch status {
	case flashgate.OrderPending, flashgate.OrderProcessing:
		return sPending
	case flashgate.OrderCanceled:
		if reason == flashgate.ReasonExpired {
			return sExpired
		}
		return sCanceled
	}
	return string(status)
}

// checkStatusHistories checks each order answered 202 by porcupine.
func (c *checker) checkStatusHistories() {
	by := map[uint64][]Op{}
	var last int64
	for _, op := range c.ops {
		last = max(last, op.Call, op.Return)
		if op.Order == 0 || (op.Kind == Purchase && op.Status != 202) {
			continue
		}
		by[op.Order] = append(by[op.Order], op)
	}
	end := last + 2
	for id, ops := range by {
		o, ok := c.rows[id]
		if !ok || !slices.ContainsFunc(ops, func(op Op) bool { return op.Kind == Purchase }) {
			continue // lost: reported; calls on orders nobody bought: not this check's
		}
		h := make([]porcupine.Operation, 0, len(ops)+1)
		for i, op := range ops {
			ret := op.Return
			if ret == 0 || op.Status == 0 {
				// No answer: it may have acted at any time before the end.
				ret = end - 1
			}
			h = append(h, porcupine.Operation{ClientId: i, Input: statusIn{kind: op.Kind},
				Output: statusOut{status: op.Status, code: op.Code, state: op.State}, Call: op.Call, Return: ret})
		}
		h = append(h, porcupine.Operation{ClientId: len(ops), Input: statusIn{final: true},
			Output: statusOut{state: publicState(o.Status, o.Reason)}, Call: end, Return: end})
		if porcupine.CheckOperationsTimeout(statusModel, h, statusTimeout) == porcupine.Illegal {
			c.add(StatusHistory, id, o.UserID, "no order life explains %s", describe(ops, o))
		}
	}
}

func describe(ops []Op, o *flashgate.Order) string {
	ops = slices.Clone(ops)
	slices.SortStableFunc(ops, func(a, b Op) int { return cmp.Compare(a.Call, b.Call) })
	parts := make([]string, 0, len(ops)+1)
	for _, op := range ops {
		s := fmt.Sprintf("%s→%d", op.Kind, op.Status)
		if op.Code != "" {
			s += " " + op.Code
		}
		if op.State != "" {
			s += " " + op.State
		}
		parts = append(parts, s)
	}
	parts = append(parts, fmt.Sprintf("at rest %s %s", o.Status, o.Reason))
	return strings.Join(parts, ", ")
}
