package lua

import (
	"context"
	_ "embed"
	"fmt"
	"slices"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
)

// The order life cycle after MySQL confirmed an order: paid, or canceled (by the
// buyer, or expired unpaid) with its units back on sale. MySQL decides; these
// bindings tell Redis afterwards.

//go:embed restock.lua
var restockSrc string

// restockScript is a function of the library like the others; it lives
// beside its binding rather than in Scripts.
var restockScript = newScript("restock", restockSrc)

// RestockOutcome is what restock did for one order.
type RestockOutcome uint8

const (
	// Restocked: the order's units went back now (stock up, buyer's counter down).
	Restocked RestockOutcome = iota + 1
	// RestockAlready: they went back before (an earlier restock, or the order
	// failed and release gave them back); only the record was rewritten.
	RestockAlready
	// RestockUnknown: Redis had no record of the order (it lost its data, and its
	// counters were rebuilt from MySQL without the order): the record was
	// written, the counters left alone.
	RestockUnknown
	// RestockFenced: called from an older epoch than the sale's books
	// (Keys.AtEpoch): a rebuild counted the cancel already, its membership of
	// the restocked set included; nothing was written.
	RestockFenced
)

// restockWire is the word restock.lua returns for each RestockOutcome.
var restockWire = [...]string{Restocked: "restocked", RestockAlready: "already", RestockUnknown: "unknown", RestockFenced: "fenced"}

func (o RestockOutcome) String() string {
	if int(o) < len(restockWire) {
		return restockWire[o]
	}
	return "restock(" + strconv.Itoa(int(o)) + ")"
}

// RestockResult is what Restock did.
type RestockResult struct {
	Outcome RestockOutcome
}

// Restock puts the units of one order MySQL has canceled back into Redis,
// exactly once however often it is called (see RestockMany).
func (s *Scripts) Restock(ctx context.Context, c rueidis.Client, k *Keys, o flashgate.Order) (RestockResult, error) {
	out, err := s.RestockMany(ctx, c, k, []flashgate.Order{o})
	if err != nil {
		return RestockResult{}, err
	}
	return RestockResult{Outcome: out[0]}, nil
}

// RestockMany puts the units of orders MySQL has canceled (each as MySQL has
// it, with the status and reason MySQL gave it) back into Redis in one
// script call: each order's stock key goes up by its quantity and its buyer's
// counter down, its reservation ends, and its record gets MySQL's status and
// reason. Each order's units go back once, however often it is called and
// whatever a concurrent confirm wrote into its record. An order Redis has no
// record of only gets its record (RestockUnknown). k must carry every region
// the orders are in; it answers one outcome per order, in order.
//
// On a split sale each order is restocked in its buyer's home bucket (one
// call per bucket the orders are in).
func (s *Scripts) RestockMany(ctx context.Context, c rueidis.Client, k *Keys, orders []flashgate.Order) ([]RestockOutcome, error) {
	if len(orders) == 0 {
		return nil, nil
	}
	if len(k.buckets) > 0 {
		out := make([]RestockOutcome, len(orders))
		err := byHome(k, len(orders), func(i int) string { return orders[i].UserID }, func(b *Keys, at []int) error {
			part := make([]flashgate.Order, len(at))
			for j, i := range at {
				part[j] = orders[i]
			}
			res, err := s.RestockMany(ctx, c, b, part)
			for j, i := range at {
				if j < len(res) {
					out[i] = res[j]
				}
			}
			return err
		})
		return out, err
	}
	keys := []string{k.Users, k.Resv, k.Orders, k.Restocked(), k.giveBack(), k.Epoch}
	index := map[string]string{}
	args := make([]string, 1, 1+5*len(orders))
	args[0] = strconv.Itoa(len(orders))
	var windows []string
	for i := range orders {
		o := &orders[i]
		ws, _, err := k.windowKeys(o.Charges)
		if err != nil {
			return nil, fmt.Errorf("restock %s/%d: %w", k.Sale, o.ID, err)
		}
		for _, w := range ws {
			if !slices.Contains(windows, w) {
				windows = append(windows, w)
			}
		}
		idx, ok := index[o.Region]
		if !ok {
			stock, known := k.Stock(o.Region)
			if !known {
				return nil, fmt.Errorf("restock %s/%d: %w %q", k.Sale, o.ID, ErrUnknownRegion, o.Region)
			}
			keys = append(keys, stock)
			idx = strconv.Itoa(len(keys))
			index[o.Region] = idx
		}
		args = append(args, strconv.FormatUint(o.ID, 10), idx, string(o.Status), o.Reason, EncodeResv(o))
	}
	encs := make([]string, len(orders))
	for i := range orders {
		encs[i] = orders[i].Charges
	}
	away, err := k.awayFields(encs...)
	if err != nil {
		return nil, fmt.Errorf("restock %s: %w", k.Sale, err)
	}
	args = append(args, away)
	for _, w := range windows {
		keys = append(keys, k.Limit(w))
		args = append(args, w, strconv.Itoa(len(keys)))
	}
	args = append(args, k.callerEpoch())
	words, err := restockScript.Exec(ctx, c, keys, args).AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("restock %s: %w", k.Sale, err)
	}
	if away != "" {
		// The charges counted in other buckets that this restock (or an
		// earlier one that died before this step) left in the give-backs.
		ids := make([]string, len(orders))
		for i := range orders {
			ids[i] = strconv.FormatUint(orders[i].ID, 10)
		}
		if _, err := giveBack(ctx, c, k, ids); err != nil {
			return nil, fmt.Errorf("restock %s: %w", k.Sale, err)
		}
	}
	if len(words) == 1 && fromWire[RestockOutcome](restockWire[:], words[0]) == RestockFenced {
		out := make([]RestockOutcome, len(orders))
		for i := range out {
			out[i] = RestockFenced
		}
		return out, nil
	}
	if len(words) != len(orders) {
		return nil, fmt.Errorf("restock %s: %d answers for %d orders", k.Sale, len(words), len(orders))
	}
	out := make([]RestockOutcome, len(words))
	for i, w := range words {
		if out[i] = fromWire[RestockOutcome](restockWire[:], w); out[i] == 0 {
			return nil, fmt.Errorf("restock %s: unexpected reply %q", k.Sale, w)
		}
	}
	return out, nil
}

// MarkPaid writes an order's paid status back to Redis (after MySQL recorded
// the payment), rewriting the record from o if Redis lost it.
func (s *Scripts) MarkPaid(ctx context.Context, c rueidis.Client, k *Keys, o flashgate.Order) error {
	o.Status = flashgate.OrderPaid
	_, err := s.Confirm(ctx, c, k, []flashgate.Order{o})
	return err
}
