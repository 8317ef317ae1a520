package lua

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"
)

//go:embed reconcile.lua
var reconcileSrc string

// reconcileScript is package-level (not in Scripts) so Load stays as it was;
// rueidis still calls it with EVALSHA.
var reconcileScript = rueidis.NewLuaScript(reconcileSrc)

// StockPlan is what MySQL says one stock key should hold, apart from the
// reservations, which the script counts itself.
type StockPlan struct {
	Region string // "" for a sale without regions
	// Avail is the region's (or the sale's) total minus MySQL's sold.
	Avail int64
	// Extra is taken off besides the reservations: units of orders in flight
	// that Redis holds no reservation of, minus units of reservations whose
	// order MySQL has already counted in sold.
	Extra int64
	// Reserved is the units the caller saw reserved in the region; the script
	// writes nothing if they differ now. Negative: not checked.
	Reserved int64
}

// StockChange is what the script did to one stock key.
type StockChange struct {
	Region string `json:"region"`
	// Before is the value before; nil when the key was absent.
	Before *int64 `json:"before"`
	// After is the value written; nil when the key was left alone.
	After *int64 `json:"after"`
}

// resetReply is the first word of reconcile.lua's answer.
type resetReply string

const (
	resetOK      resetReply = "ok"      // the keys were set as planned
	resetChanged resetReply = "changed" // the reservations moved: nothing was written
)

// ErrReservationsChanged means the reservations moved between the caller's
// read and the script: nothing was written.
var ErrReservationsChanged = errors.New("reservations changed")

// ResetStock sets the sale's stock keys to plan.Avail − plan.Extra − the units
// reserved in the region now, atomically with counting those reservations:
// every key (onlyMissing false) or only the absent ones. It answers one change
// per plan, in order.
//
// A split sale's stock is reset bucket by bucket (resetBucketed), each bucket
// atomically with its own reservations.
func (s *Scripts) ResetStock(ctx context.Context, c rueidis.Client, k *Keys, onlyMissing bool, plans []StockPlan) ([]StockChange, error) {
	if len(k.buckets) > 0 {
		return s.resetBucketed(ctx, c, k, onlyMissing, plans)
	}
	mode := "all"
	if onlyMissing {
		mode = "missing"
	}
	keys := make([]string, 0, 1+len(plans))
	keys = append(keys, k.Resv)
	args := make([]string, 0, 1+4*len(plans))
	args = append(args, mode)
	for _, p := range plans {
		key, ok := k.Stock(p.Region)
		if !ok {
			return nil, fmt.Errorf("reset stock %s: %w %q", k.Sale, ErrUnknownRegion, p.Region)
		}
		expected := ""
		if p.Reserved >= 0 {
			expected = strconv.FormatInt(p.Reserved, 10)
		}
		keys = append(keys, key)
		args = append(args, p.Region, strconv.FormatInt(p.Avail, 10), strconv.FormatInt(p.Extra, 10), expected)
	}
	res, err := reconcileScript.Exec(ctx, c, keys, args).AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("reset stock %s: %w", k.Sale, err)
	}
	if len(res) > 0 && resetReply(res[0]) == resetChanged && len(res) == 4 {
		return nil, fmt.Errorf("reset stock %s: region %q: %w (expected %s reserved, found %s)",
			k.Sale, res[1], ErrReservationsChanged, res[2], res[3])
	}
	if len(res) != 1+2*len(plans) || resetReply(res[0]) != resetOK {
		return nil, fmt.Errorf("reset stock %s: unexpected reply %q", k.Sale, res)
	}
	out := make([]StockChange, len(plans))
	for i, p := range plans {
		out[i] = StockChange{Region: p.Region, Before: optInt(res[1+2*i]), After: optInt(res[2+2*i])}
	}
	return out, nil
}

func optInt(s string) *int64 {
	if s == "" {
		return nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return nil
	}
	return &n
}
