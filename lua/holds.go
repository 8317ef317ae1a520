package lua

import (
	"context"
	_ "embed"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
)

// Purchase limits on a sale with buckets (docs/buckets.md, "Purchase limits
// by phone, device, IP or address"). The counter of a limit's subject lives
// in ONE bucket, LimitBucket(subject): every user sharing a phone meets at the
// same counter, whatever their home. A charge whose counter is in the buyer's
// home bucket (every per-user charge, and a subject that hashes there) is
// checked by admit.lua as on any sale; a charge counted in another bucket is
// held there first (hold.lua: check and count, and an entry under the order
// id), then the admission runs on the home with that charge's increment at 0,
// and the hold is kept (the order exists) or given back (refused). A crash
// between leaves the hold undecided; reconcile decides it (FinishHolds): the
// order's record in the home bucket says it was admitted, or, when there is
// none, a tombstone written in its place makes sure it never will be, and the
// hold is given back. When an order's units come back (release.lua,
// restock.lua) its charges held in other buckets go into the home's
// give-backs hash in the same step, and are given back in their buckets from
// there (giveBack), by the caller or, after a crash, by reconcile.

var (
	//go:embed hold.lua
	holdSrc string
	//go:embed unhold.lua
	unholdSrc string
	//go:embed holdcheck.lua
	holdCheckSrc string

	holdScript      = newScript("hold", holdSrc).reading(1)
	unholdScript    = newScript("unhold", unholdSrc)
	holdCheckScript = newScript("holdcheck", holdCheckSrc)
)

// HoldGrace is how long a hold may stay undecided before reconcile decides
// it: far longer than an admission takes (gateway.admit_timeout). Deciding
// one early cannot break a limit (the tombstone makes the late admission
// answer duplicate_id); it only refuses that purchase. A hold's age is judged
// on one clock: hold.lua stamps it with its master's TIME, and reconcile
// reads that master's TIME (ServerTime) to age it.
const HoldGrace = 30 * time.Second

// holdExpired is the reason of the tombstone FinishHolds writes for an order
// whose hold it gave back (holdcheck.lua).
const holdExpired = "hold_expired"

// holdReply is the first word of hold.lua's answer; every word but holdHeld
// is admit.lua's for the same refusal (parseAdmission reads them).
type holdReply string

const (
	holdHeld         holdReply = "held"
	holdNotWarmed    holdReply = "not_warmed"
	holdEnded        holdReply = "ended"
	holdNotStarted   holdReply = "not_started"
	holdBadQuantity  holdReply = "bad_quantity"
	holdLimitReached holdReply = "limit_reached"
	holdDuplicate    holdReply = "duplicate_id"
	holdPaused       holdReply = "paused"
)

// unholdReply is unhold.lua's word for one id.
type unholdReply string

const (
	unholdKept  unholdReply = "kept"  // the hold is now the order's count
	unholdGiven unholdReply = "given" // its counts went down now
	unholdNone  unholdReply = "none"  // nothing to do: decided before, or never held
)

// holdCheckReply is holdcheck.lua's word for one id.
type holdCheckReply string

const (
	holdAdmitted holdCheckReply = "admitted" // the order exists
	holdAborted  holdCheckReply = "aborted"  // it does not, and never will
)

// unhold.lua's modes.
const (
	unholdKeep = "keep"
	unholdGive = "give"
)

// LimitBucket is the bucket (0..k-1) that holds the purchase-limit counters
// of subject (a user, a normalised phone, device, IP or address) on a sale of
// k buckets: HomeBucket of the subject, so a user's own counters are in their
// home bucket.
func LimitBucket(subject string, k int) int { return HomeBucket(subject, k) }

// away groups the charges of buyer's home bucket h that are counted in other
// buckets by bucket (nil: none, or the sale is not split).
func (h *Keys) away(cs []flashgate.Charge) map[int][]flashgate.Charge {
	if h.parent == nil {
		return nil
	}
	var out map[int][]flashgate.Charge
	for _, c := range cs {
		if b := LimitBucket(c.Subject, len(h.parent.buckets)); b != h.index {
			if out == nil {
				out = map[int][]flashgate.Charge{}
			}
			out[b] = append(out[b], c)
		}
	}
	return out
}

// awayFields lists, comma-separated, the fields ('<limit>/<subject>') of the
// encoded charges that home bucket h does not count: what release.lua and
// restock.lua leave to giveBack.
func (h *Keys) awayFields(charges ...string) (string, error) {
	if h.parent == nil {
		return "", nil
	}
	var fields []string
	for _, enc := range charges {
		cs, err := flashgate.ParseCharges(enc)
		if err != nil {
			return "", err
		}
		for _, cs := range h.away(cs) {
			for _, c := range cs {
				if f := c.Field(); !slices.Contains(fields, f) {
					fields = append(fields, f)
				}
			}
		}
	}
	return strings.Join(fields, ","), nil
}

// AdmitHeld is AdmitBucketedWait with every purchase limit of the sale,
// whatever its dimension: the charges counted in other buckets than the
// buyer's home are held there first (one script call per such bucket), in
// bucket order. A purchase without such charges (a sale not split, no
// limits, limits by user, a subject whose bucket is the home) is the one
// script call it always was.
func (s *Scripts) AdmitHeld(ctx context.Context, c rueidis.Client, k *Keys, a AdmitArgs, replicas int, timeout time.Duration) (Admission, error) {
	if len(k.buckets) == 0 || len(a.Charges) == 0 {
		return s.AdmitBucketedWait(ctx, c, k, a, replicas, timeout)
	}
	home := k.Home(a.User)
	away := home.away(a.Charges)
	if len(away) == 0 {
		return s.AdmitBucketedWait(ctx, c, k, a, replicas, timeout)
	}
	if a.EncodedCharges == "" {
		a.EncodedCharges = flashgate.EncodeCharges(a.Charges)
	}
	order := make([]int, 0, len(away))
	for b := range away {
		order = append(order, b)
	}
	slices.Sort(order)
	var held []int
	// giveUp gives back what was held; a failure leaves the holds to
	// reconcile, which finds no order and gives them back.
	giveUp := func(bs []int) {
		_, _ = s.decideHolds(ctx, c, k, unholdGive, a.OrderID, bs, away)
	}
	for _, b := range order {
		adm, acked, err := s.hold(ctx, c, k.buckets[b], a, away[b], replication{replicas: replicas, timeout: timeout})
		if err != nil {
			// It may have held (an answer lost): give that back too.
			giveUp(append(held, b))
			return Admission{}, err
		}
		if adm.Outcome == 0 && !acked {
			// Held, but fewer replicas than asked for have the hold: a
			// failover could lose the count, and the limit with it. Like an
			// admission that is not replicated, it is given back and the
			// purchase is not promised (the caller undoes it: its release
			// tombstones the id, so no admission of it can follow).
			giveUp(append(held, b))
			return Admission{}, fmt.Errorf("hold %s bucket %d: %w: fewer than %d replicas within %v", k.Sale, b, ErrNotReplicated, replicas, timeout)
		}
		if adm.Outcome != 0 {
			giveUp(held)
			if a.IdemKey != "" {
				// admit.lua answers a replay before anything else: so does
				// a refused hold.
				if id, ok, err := replayOf(ctx, c, home, a.User, a.IdemKey); err != nil {
					return Admission{}, err
				} else if ok {
					return Admission{Outcome: Replayed, OrderID: id}, nil
				}
			}
			return adm, nil
		}
		held = append(held, b)
	}
	// The home checks and counts the rest; the held charges go as 0.
	local := slices.Clone(a.Charges)
	for i := range local {
		if LimitBucket(local[i].Subject, len(k.buckets)) != home.index {
			local[i].Inc = 0
		}
	}
	b := a
	b.Charges = local
	adm, err := s.AdmitBucketedWait(ctx, c, k, b, replicas, timeout)
	if err != nil {
		// The admission may have run, or may yet: reconcile decides the
		// holds from the home's record (FinishHolds).
		return adm, err
	}
	mode := unholdGive
	if adm.Outcome == Admitted {
		mode = unholdKeep
	}
	// A failure leaves the holds undecided, for reconcile: the answer stands.
	missing, err := s.decideHolds(ctx, c, k, mode, a.OrderID, held, away)
	if err == nil && len(missing) > 0 && mode == unholdKeep {
		// A hold gone before its keep: its master lost its data between
		// hold.lua and now, and the order's charges there are counted
		// nowhere. They are counted again, as the order's (recount), and
		// the purchase is not promised: the caller undoes it (its release
		// gives them back), unless a replay of its key claimed it first, in
		// which case the order lives on with its charges counted.
		for _, b := range missing {
			if err := recount(ctx, c, k.buckets[b], a, away[b]); err != nil {
				return adm, err
			}
		}
		return adm, fmt.Errorf("admit %s/%d: %w", k.Sale, a.OrderID, ErrHoldLost)
	}
	return adm, nil
}

// hold runs hold.lua on bucket b for the charges of a counted there. It
// answers Outcome 0 when it held them, else what refused them, and whether
// w.replicas replicas of b's master had the hold within the wait (WAIT on
// the script's connection, as AdmitWait; always true without a wait).
func (s *Scripts) hold(ctx context.Context, c rueidis.Client, b *Keys, a AdmitArgs, cs []flashgate.Charge, w replication) (Admission, bool, error) {
	keys := []string{b.Meta, b.holds}
	args := []string{strconv.FormatUint(a.OrderID, 10), strconv.FormatInt(a.Now.UnixMilli(), 10), a.User,
		strconv.FormatInt(a.Quantity, 10), a.Region, flashgate.EncodeCharges(cs)}
	for _, ch := range cs {
		keys = append(keys, b.Limit(ch.Window))
		args = append(args, ch.Field(), strconv.FormatInt(ch.Inc, 10), strconv.FormatInt(ch.ExpiresAtMillis(), 10))
	}
	r, acked, err := execWait(ctx, c, holdScript, keys, args, w)
	if err != nil {
		return Admission{}, false, fmt.Errorf("hold %s bucket %d: %w", b.Sale, b.index, err)
	}
	res, err := r.ToArray()
	if err != nil {
		return Admission{}, false, fmt.Errorf("hold %s bucket %d: %w", b.Sale, b.index, err)
	}
	if word, _ := res[0].ToString(); holdReply(word) == holdHeld {
		return Admission{}, acked, nil
	}
	adm, err := parseAdmission(res)
	if err != nil {
		return adm, true, fmt.Errorf("hold %s: %w", b.Sale, err)
	}
	if adm.Outcome == LimitReached {
		adm.Limit++ // hold.lua answers the limit's index, not a charge's position
	}
	return adm, true, nil
}

// replayOf reads the order an idempotency key of user holds in home bucket h.
func replayOf(ctx context.Context, c rueidis.Client, h *Keys, user, key string) (uint64, bool, error) {
	v, err := c.Do(ctx, c.B().Hget().Key(h.Idem).Field(user+"|"+key).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	id, err := strconv.ParseUint(v, 10, 64)
	return id, err == nil, err
}

// decideHolds keeps or gives back order id's holds in buckets bs (charges:
// what each bucket holds).
func (s *Scripts) decideHolds(ctx context.Context, c rueidis.Client, k *Keys, mode string, id uint64, bs []int, charges map[int][]flashgate.Charge) (missing []int, err error) {
	sid := strconv.FormatUint(id, 10)
	for _, b := range bs {
		var windows []string
		for _, ch := range charges[b] {
			if !slices.Contains(windows, ch.Window) {
				windows = append(windows, ch.Window)
			}
		}
		words, err := unhold(ctx, c, k.buckets[b], mode, []string{sid}, windows)
		if err != nil {
			return missing, err
		}
		if slices.Contains(words, string(unholdNone)) {
			missing = append(missing, b)
		}
	}
	return missing, nil
}

// recountSrc counts an order's charges in a bucket again and keeps them as
// its (a kept hold, lheld), once, with no limit check: the hold that counted
// them is gone and the order may exist (AdmitHeld).
//
//	KEYS: 1 held, 2.. the counter hash of each charge
//	ARGV: 1 order id, 2 the kept hold's entry, then per charge: field,
//	      increment, expiry (unix ms, on this server's clock; 0: none)
const recountSrc = `if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
for j = 2, #KEYS do
  local a = 3 + 3 * (j - 2)
  redis.call('HINCRBY', KEYS[j], ARGV[a], tonumber(ARGV[a + 1]))
  if ARGV[a + 2] ~= '0' then redis.call('PEXPIREAT', KEYS[j], ARGV[a + 2]) end
end
return 1`

var recountScript = newScript("recount", recountSrc)

// recount runs recountSrc for order a's charges cs in bucket b.
func recount(ctx context.Context, c rueidis.Client, b *Keys, a AdmitArgs, cs []flashgate.Charge) error {
	keys := []string{b.held}
	args := []string{strconv.FormatUint(a.OrderID, 10), strconv.FormatInt(a.Now.UnixMilli(), 10) + "|" + a.User + "|" +
		strconv.FormatInt(a.Quantity, 10) + "|" + a.Region + "|" + flashgate.EncodeCharges(cs)}
	for _, ch := range cs {
		keys = append(keys, b.Limit(ch.Window))
		args = append(args, ch.Field(), strconv.FormatInt(ch.Inc, 10), strconv.FormatInt(ch.ExpiresAtMillis(), 10))
	}
	if err := recountScript.Exec(ctx, c, keys, args).Error(); err != nil {
		return fmt.Errorf("recount %s bucket %d: %w", b.Sale, b.index, err)
	}
	return nil
}

// unhold runs unhold.lua on bucket b for ids; windows name every window their
// charges count in (give mode).
func unhold(ctx context.Context, c rueidis.Client, b *Keys, mode string, ids, windows []string) ([]string, error) {
	keys := []string{b.holds, b.held}
	args := append([]string{mode, strconv.Itoa(len(ids))}, ids...)
	for _, w := range windows {
		keys = append(keys, b.Limit(w))
		args = append(args, w)
	}
	out, err := unholdScript.Exec(ctx, c, keys, args).AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("unhold %s bucket %d: %w", b.Sale, b.index, err)
	}
	if len(out) != len(ids) {
		return nil, fmt.Errorf("unhold %s bucket %d: %d answers for %d ids", b.Sale, b.index, len(out), len(ids))
	}
	return out, nil
}

// giveBack gives back, in their buckets, the charges that release.lua or
// restock.lua left in home bucket h's give-backs for orders ids (all of them
// when ids is nil), then clears those entries. Each bucket gives an order's
// counts back once (unhold.lua deletes its entry), so a give-back repeated
// after a crash between the two steps counts nothing twice. It answers how
// many entries it cleared.
func giveBack(ctx context.Context, c rueidis.Client, h *Keys, ids []string) (int, error) {
	if h.parent == nil {
		return 0, nil
	}
	entries := map[string]string{}
	if ids == nil {
		m, err := c.Do(ctx, c.B().Hgetall().Key(h.back).Build()).AsStrMap()
		if err != nil {
			return 0, fmt.Errorf("give-backs of %s bucket %d: %w", h.Sale, h.index, err)
		}
		entries = m
	} else if len(ids) > 0 {
		vs, err := c.Do(ctx, c.B().Hmget().Key(h.back).Field(ids...).Build()).ToArray()
		if err != nil {
			return 0, fmt.Errorf("give-backs of %s bucket %d: %w", h.Sale, h.index, err)
		}
		for i, v := range vs {
			if s, err := v.ToString(); err == nil {
				entries[ids[i]] = s
			}
		}
	}
	if len(entries) == 0 {
		return 0, nil
	}
	n := len(h.parent.buckets)
	type give struct{ ids, windows []string }
	per := map[int]*give{}
	done := make([]string, 0, len(entries))
	for id, enc := range entries {
		cs, err := flashgate.ParseCharges(enc)
		if err != nil {
			return 0, fmt.Errorf("give-back of %s/%s: %w", h.Sale, id, err)
		}
		for _, ch := range cs {
			b := LimitBucket(ch.Subject, n)
			g := per[b]
			if g == nil {
				g = &give{}
				per[b] = g
			}
			if !slices.Contains(g.ids, id) {
				g.ids = append(g.ids, id)
			}
			if !slices.Contains(g.windows, ch.Window) {
				g.windows = append(g.windows, ch.Window)
			}
		}
		done = append(done, id)
	}
	for b, g := range per {
		if _, err := unhold(ctx, c, h.parent.buckets[b], unholdGive, g.ids, g.windows); err != nil {
			return 0, err
		}
	}
	if err := c.Do(ctx, c.B().Hdel().Key(h.back).Field(done...).Build()).Error(); err != nil {
		return 0, fmt.Errorf("give-backs of %s bucket %d: %w", h.Sale, h.index, err)
	}
	return len(done), nil
}

// HoldsReport is what FinishHolds did.
type HoldsReport struct {
	GivenBack int // give-backs left by a crash after a release or restock, finished
	Kept      int // undecided holds whose order exists: now its count
	Aborted   int // undecided holds with no order: given back, the order id tombstoned
}

// FinishHolds decides what processes left half done with the purchase limits
// of a split sale (docs/buckets.md): the give-backs a release or restock
// wrote and no one finished, and the holds undecided for HoldGrace (a crash,
// or a lost answer, between hold and admission). Safe beside live
// admissions: a hold younger than HoldGrace is left alone, and an older one
// whose admission comes late is refused by the tombstone.
func FinishHolds(ctx context.Context, c rueidis.Client, k *Keys) (HoldsReport, error) {
	return finishHolds(ctx, c, k, 0)
}

// finishHolds is FinishHolds with each bucket's clock read ahead by ahead (a
// test's way to age holds).
func finishHolds(ctx context.Context, c rueidis.Client, k *Keys, ahead time.Duration) (HoldsReport, error) {
	var rep HoldsReport
	n := len(k.buckets)
	for _, h := range k.buckets {
		got, err := giveBack(ctx, c, h, nil)
		rep.GivenBack += got
		if err != nil {
			return rep, err
		}
	}
	// Undecided holds past the grace, per counter bucket, grouped by the
	// order's home.
	for _, b := range k.buckets {
		m, err := c.Do(ctx, c.B().Hgetall().Key(b.holds).Build()).AsStrMap()
		if err != nil {
			return rep, fmt.Errorf("holds of %s bucket %d: %w", k.Sale, b.index, err)
		}
		if len(m) == 0 {
			continue
		}
		// The clock that stamped these holds (hold.lua), read after them.
		now, err := ServerTime(ctx, c, b.holds)
		if err != nil {
			return rep, fmt.Errorf("holds of %s bucket %d: %w", k.Sale, b.index, err)
		}
		now = now.Add(ahead)
		type entry struct{ id, tomb string }
		byHome := map[int][]entry{}
		windows := map[string][]string{}
		for id, v := range m {
			p := strings.SplitN(v, "|", 5)
			if len(p) != 5 {
				return rep, fmt.Errorf("hold %s of %s: bad entry %q", id, k.Sale, v)
			}
			at, _ := strconv.ParseInt(p[0], 10, 64)
			if now.Sub(time.UnixMilli(at)) < HoldGrace {
				continue
			}
			cs, err := flashgate.ParseCharges(p[4])
			if err != nil {
				return rep, fmt.Errorf("hold %s of %s: %w", id, k.Sale, err)
			}
			for _, ch := range cs {
				if !slices.Contains(windows[id], ch.Window) {
					windows[id] = append(windows[id], ch.Window)
				}
			}
			// The tombstone: a released record of the order, quantity and all.
			tomb := string(StatusReleased) + "|" + holdExpired + "|" + p[1] + "|" + p[2] + "|" + p[3] + "|" + p[0] + "|" + p[0] + "||"
			byHome[HomeBucket(p[1], n)] = append(byHome[HomeBucket(p[1], n)], entry{id, tomb})
		}
		for hi, es := range byHome {
			args := []string{strconv.Itoa(len(es))}
			for _, e := range es {
				args = append(args, e.id, e.tomb)
			}
			args = append(args, holdExpired)
			words, err := holdCheckScript.Exec(ctx, c, []string{k.buckets[hi].Orders}, args).AsStrSlice()
			if err != nil {
				return rep, fmt.Errorf("hold check %s bucket %d: %w", k.Sale, hi, err)
			}
			if len(words) != len(es) {
				return rep, fmt.Errorf("hold check %s bucket %d: %d answers for %d", k.Sale, hi, len(words), len(es))
			}
			var keep, give, ws []string
			for i, w := range words {
				switch holdCheckReply(w) {
				case holdAdmitted:
					keep = append(keep, es[i].id)
				case holdAborted:
					give = append(give, es[i].id)
					for _, win := range windows[es[i].id] {
						if !slices.Contains(ws, win) {
							ws = append(ws, win)
						}
					}
				default:
					return rep, fmt.Errorf("hold check %s: unexpected reply %q", k.Sale, w)
				}
			}
			if len(keep) > 0 {
				out, err := unhold(ctx, c, b, unholdKeep, keep, nil)
				if err != nil {
					return rep, err
				}
				rep.Kept += count(out, unholdKept)
			}
			if len(give) > 0 {
				out, err := unhold(ctx, c, b, unholdGive, give, ws)
				if err != nil {
					return rep, err
				}
				rep.Aborted += count(out, unholdGiven)
			}
		}
	}
	return rep, nil
}

func count(words []string, w unholdReply) int {
	n := 0
	for _, x := range words {
		if unholdReply(x) == w {
			n++
		}
	}
	return n
}

// HeldEntries are the kept holds a live order leaves in the buckets that
// count its charges away from its home (by phone, device, IP, address): bucket
// index → the lheld entry, so that when its units come back those counts are
// given back once (unhold.lua finds the entry). Empty on a sale that is not
// split, or for an order with no such charge.
func HeldEntries(k *Keys, o *flashgate.Order) (map[int]string, error) {
	if len(k.buckets) == 0 || o.Charges == "" {
		return nil, nil
	}
	cs, err := flashgate.ParseCharges(o.Charges)
	if err != nil {
		return nil, fmt.Errorf("order %s/%d: %w", k.Sale, o.ID, err)
	}
	out := map[int]string{}
	for b, part := range k.Home(o.UserID).away(cs) {
		out[b] = strconv.FormatInt(unixMilli(o.CreatedAt), 10) + "|" + o.UserID + "|" + strconv.FormatInt(o.Quantity, 10) + "|" +
			o.Region + "|" + flashgate.EncodeCharges(part)
	}
	return out, nil
}

// HoldCharges are the charges an undecided hold's entry (hold.lua) counts in
// its bucket, and the id of the user it holds for.
func HoldCharges(v string) (user string, cs []flashgate.Charge, err error) {
	f := strings.SplitN(v, "|", 5)
	if len(f) != 5 {
		return "", nil, fmt.Errorf("hold entry %q", v)
	}
	cs, err = flashgate.ParseCharges(f[4])
	return f[1], cs, err
}
