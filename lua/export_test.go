package lua

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// Hooks for the external tests of purchase-limit holds (holds_test.go).

// FinishHoldsAt is FinishHolds as if run at now: each bucket's clock is read
// ahead by now's distance from this process's clock.
func FinishHoldsAt(ctx context.Context, c rueidis.Client, k *Keys, now time.Time) (HoldsReport, error) {
	return finishHolds(ctx, c, k, time.Until(now))
}

// HoldOnly takes a's holds in the buckets that count its charges away from
// its home, and nothing else: a gateway that died after them.
func (s *Scripts) HoldOnly(ctx context.Context, c rueidis.Client, k *Keys, a AdmitArgs) (Outcome, error) {
	for b, cs := range k.Home(a.User).away(a.Charges) {
		adm, _, err := s.hold(ctx, c, k.buckets[b], a, cs, replication{})
		if err != nil || adm.Outcome != 0 {
			return adm.Outcome, err
		}
	}
	return 0, nil
}

// HomeAdmitOnly runs the home bucket's admission of a whose holds were taken
// (held charges at 0), and decides no hold: a gateway that died after it.
func (s *Scripts) HomeAdmitOnly(ctx context.Context, c rueidis.Client, k *Keys, a AdmitArgs) (Admission, error) {
	home := k.Home(a.User)
	a.Charges = append(a.Charges[:0:0], a.Charges...)
	for i := range a.Charges {
		if LimitBucket(a.Charges[i].Subject, len(k.buckets)) != home.index {
			a.Charges[i].Inc = 0
		}
	}
	return s.Admit(ctx, c, home, a)
}

// ReleaseScriptOnly runs release.lua in backend mode on home bucket h and not
// the give-back after it: a backend that died between the two.
func (s *Scripts) ReleaseScriptOnly(ctx context.Context, c rueidis.Client, h *Keys, id uint64, charges string) error {
	stock, _ := h.Stock("")
	windows, wkeys, err := h.windowKeys(charges)
	if err != nil {
		return err
	}
	away, err := h.awayFields(charges)
	if err != nil {
		return err
	}
	return s.release.Exec(ctx, c, append([]string{stock, h.Users, h.Resv, h.Orders, h.Idem, h.giveBack(), h.Epoch}, wkeys...),
		append([]string{strconv.FormatUint(id, 10), ReleaseBackend, "test", "", away, h.callerEpoch()}, windows...)).Error()
}

// HoldKeys are a bucket's hashes of holds: undecided, kept, give-backs.
func (k *Keys) HoldKeys() []string { return []string{k.holds, k.held, k.back} }
