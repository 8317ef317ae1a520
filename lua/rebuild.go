package lua

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// The Redis side of the one rebuild (backend/rebuild.go, docs/recovery.md "One
// rebuild"): Redis's books of a sale are a projection of MySQL and the stream,
// and one function derives the whole projection. It runs in three steps on
// every hash tag of the sale (its buckets first, its own tag, whose meta means
// "warm", last):
//
//  1. Fence (fence.lua): admissions stop (meta gone: not_warmed), and every
//     write-back from an older epoch is refused from then on.
//  2. ReadLive: what only Redis knows (orders admitted and not yet in the
//     stream, tombstones, undecided holds); the caller derives the books from
//     MySQL, the stream and this, and writes them under staged names (Stage).
//  3. Install (install.lua): the staged keys replace the live ones and the
//     tag's epoch becomes the rebuild's in one step, unless what ReadLive read
//     moved meanwhile (ErrRebuildMoved: read again).

var (
	//go:embed fence.lua
	fenceSrc string
	//go:embed install.lua
	installSrc string

	fenceScript   = newScript("fence", fenceSrc)
	installScript = newScript("install", installSrc)
)

// stagedTTL is how long staged keys live if their install never comes (the
// rebuild died): the next rebuild writes them anew either way.
const stagedTTL = 10 * time.Minute

// stageChunk is the fields of one staged HSET or SADD.
const stageChunk = 500

// ErrRebuildMoved means install found that what the rebuild read of the live
// keys moved (a release, a claim, a decided hold): nothing was installed.
var ErrRebuildMoved = errors.New("the live books moved during the rebuild")

// Books is everything Redis holds of one hash tag of a sale, as a rebuild
// derives it. A sale's own tag of a split sale holds only Meta.
type Books struct {
	Meta      []string                    // field, value pairs (metaFields)
	Stock     map[string]int64            // region ("" for none) → units
	Users     map[string]int64            // buyer → units held
	Resv      map[string]string           // order id → EncodeResv: admitted, not settled
	Orders    map[string]string           // order id → EncodeRecord
	Idem      map[string]string           // "<user>|<key>" → order id
	Restocked []string                    // ids of orders whose units came back
	Limits    map[string]map[string]int64 // window → "<limit>/<subject>" → count
	LimitEnd  map[string]time.Time        // window → when its counter expires (zero: never)
	Holds     map[string]string           // undecided holds (lhold)
	Held      map[string]string           // kept holds (lheld)
}

// NewBooks is an empty Books.
func NewBooks() *Books {
	return &Books{Stock: map[string]int64{}, Users: map[string]int64{}, Resv: map[string]string{}, Orders: map[string]string{},
		Idem: map[string]string{}, Limits: map[string]map[string]int64{}, LimitEnd: map[string]time.Time{},
		Holds: map[string]string{}, Held: map[string]string{}}
}

// Count adds n to field of window's counter, which expires at end (zero:
// never).
func (b *Books) Count(window, field string, n int64, end time.Time) {
	m := b.Limits[window]
	if m == nil {
		m = map[string]int64{}
		b.Limits[window] = m
	}
	m[field] += n
	if !end.IsZero() {
		b.LimitEnd[window] = end
	}
}

// Live is what a rebuild reads of one tag's live keys after its fence.
type Live struct {
	Resv   map[string]string
	Orders map[string]string
	Holds  map[string]string
}

// MetaFields is what a rebuild writes into every meta of the sale: its spec
// and state.
var MetaFields = metaFields

// Fence runs the first step of rebuild epoch on every tag of the sale: its
// buckets, then its own tag.
func Fence(ctx context.Context, c rueidis.Client, k *Keys, epoch int64) error {
	for _, t := range k.Tags() {
		err := fenceScript.Exec(ctx, c, []string{t.Meta, t.Epoch}, []string{strconv.FormatInt(epoch, 10)}).Error()
		if err != nil {
			return fmt.Errorf("fence %s: %w", k.Sale, err)
		}
	}
	return nil
}

// Tags lists the keys of every hash tag of the sale, in the order a rebuild
// installs them: the buckets, then the sale's own.
func (k *Keys) Tags() []*Keys {
	return append(slices.Clone(k.buckets), k)
}

// ReadLive reads what a rebuild keeps of tag t's live keys.
func ReadLive(ctx context.Context, c rueidis.Client, t *Keys) (*Live, error) {
	cmds := rueidis.Commands{c.B().Hgetall().Key(t.Resv).Build(), c.B().Hgetall().Key(t.Orders).Build()}
	if t.holds != "" {
		cmds = append(cmds, c.B().Hgetall().Key(t.holds).Build())
	}
	rs := c.DoMulti(ctx, cmds...)
	l := &Live{Holds: map[string]string{}}
	var err error
	if l.Resv, err = rs[0].AsStrMap(); err != nil {
		return nil, fmt.Errorf("live %s: %w", t.Sale, err)
	}
	if l.Orders, err = rs[1].AsStrMap(); err != nil {
		return nil, fmt.Errorf("live %s: %w", t.Sale, err)
	}
	if len(rs) > 2 {
		if l.Holds, err = rs[2].AsStrMap(); err != nil {
			return nil, fmt.Errorf("live %s: %w", t.Sale, err)
		}
	}
	return l, nil
}

// pair is one live key with the staged one that replaces it.
type pair struct {
	staged, live string
	expireAt     time.Time // zero: never
}

// Install writes b under staged names and then installs it on tag t in one
// step (install.lua), checking that what live held of the orders and holds
// the rebuild kept has not moved: ErrRebuildMoved when it has, ErrStaleEpoch
// when another rebuild took the tag over (or Redis lost it).
func Install(ctx context.Context, c rueidis.Client, t *Keys, epoch int64, b *Books, live *Live) error {
	pairs, err := stage(ctx, c, t, b)
	if err != nil {
		return fmt.Errorf("stage %s: %w", t.Sale, err)
	}
	keys := []string{t.Epoch, t.Resv, t.Orders}
	if t.holds != "" {
		keys = append(keys, t.holds)
	}
	args := []string{strconv.FormatInt(epoch, 10), strconv.Itoa(len(keys) - 1), ""}
	checks := 0
	check := func(hash int, field, want string) {
		args = append(args, strconv.Itoa(hash), field, want)
		checks++
	}
	if live != nil {
		// Every order the rebuild kept from the live keys: its reservation
		// and its record as read, or still absent.
		for id, want := range live.Resv {
			check(2, id, "v"+want)
		}
		for id := range b.Resv {
			if _, ok := live.Resv[id]; !ok {
				check(2, id, "-")
			}
		}
		for id := range b.Resv {
			if v, ok := live.Orders[id]; ok {
				check(3, id, "v"+v)
			} else {
				check(3, id, "-")
			}
		}
		for id, v := range live.Orders {
			if _, pending := b.Resv[id]; !pending && IsReleased(v) {
				check(3, id, "v"+v)
			}
		}
		if t.holds != "" {
			for id, v := range live.Holds {
				check(4, id, "v"+v)
			}
		}
		// A record written since (a tombstone of a release): its count moved.
		check(3, "", "#"+strconv.Itoa(len(live.Orders)))
	}
	args[2] = strconv.Itoa(checks)
	for _, p := range pairs {
		keys = append(keys, p.staged, p.live)
	}
	for _, p := range pairs {
		at := int64(0)
		if !p.expireAt.IsZero() {
			at = p.expireAt.UnixMilli()
		}
		args = append(args, strconv.FormatInt(at, 10))
	}
	res, err := installScript.Exec(ctx, c, keys, args).AsStrSlice()
	if err != nil {
		return fmt.Errorf("install %s: %w", t.Sale, err)
	}
	switch installReply(res[0]) {
	case installOK:
		return nil
	case installFenced:
		return fmt.Errorf("install %s (epoch key %q): %w", t.Sale, res[1], ErrStaleEpoch)
	case installChanged:
		return fmt.Errorf("install %s (order %s): %w", t.Sale, res[1], ErrRebuildMoved)
	}
	return fmt.Errorf("install %s: unexpected reply %q", t.Sale, res)
}

// installReply is the first word of install.lua's answer.
type installReply string

const (
	installOK      installReply = "ok"      // installed
	installFenced  installReply = "fenced"  // another rebuild took the tag, or Redis lost it
	installChanged installReply = "changed" // what the rebuild kept moved: read again
)

// IsReleased reports whether an order's record is a gateway's release (a
// refusal, final: a tombstone when Redis had no record), which no MySQL row
// stands behind and no late admission may count.
func IsReleased(v string) bool {
	return len(v) >= len(StatusReleased)+1 && v[:len(StatusReleased)+1] == string(StatusReleased)+"|"
}

// stage writes b under the staged names of t's keys and answers every live
// key of t with its staged name (a live key whose staged one stays absent is
// deleted by install).
func stage(ctx context.Context, c rueidis.Client, t *Keys, b *Books) ([]pair, error) {
	var pairs []pair
	add := func(live string, at time.Time) string {
		s := t.staged(live)
		pairs = append(pairs, pair{staged: s, live: live, expireAt: at})
		return s
	}
	var cmds rueidis.Commands
	flush := func() error {
		err := sendAll(ctx, c, cmds)
		cmds = cmds[:0]
		return err
	}
	hash := func(live string, m map[string]string) error {
		s := add(live, time.Time{})
		cmds = append(cmds, c.B().Del().Key(s).Build())
		for part := range slices.Chunk(slices.Sorted(maps.Keys(m)), stageChunk) {
			h := c.B().Hset().Key(s).FieldValue()
			for _, f := range part {
				h = h.FieldValue(f, m[f])
			}
			cmds = append(cmds, h.Build(), c.B().Pexpire().Key(s).Milliseconds(stagedTTL.Milliseconds()).Build())
		}
		return flush()
	}
	counts := func(live string, m map[string]int64, at time.Time) error {
		s := make(map[string]string, len(m))
		for f, n := range m {
			if n > 0 {
				s[f] = strconv.FormatInt(n, 10)
			}
		}
		if err := hash(live, s); err != nil {
			return err
		}
		pairs[len(pairs)-1].expireAt = at
		return nil
	}
	if len(t.buckets) == 0 || t.parent != nil {
		if err := counts(t.Users, b.Users, time.Time{}); err != nil {
			return nil, err
		}
		for _, h := range []struct {
			key string
			m   map[string]string
		}{{t.Resv, b.Resv}, {t.Orders, b.Orders}, {t.Idem, b.Idem}, {t.holds, b.Holds}, {t.held, b.Held}} {
			if h.key == "" {
				continue
			}
			if err := hash(h.key, h.m); err != nil {
				return nil, err
			}
		}
		s := add(t.restocked, time.Time{})
		cmds = append(cmds, c.B().Del().Key(s).Build())
		for part := range slices.Chunk(b.Restocked, stageChunk) {
			cmds = append(cmds, c.B().Sadd().Key(s).Member(part...).Build(), c.B().Pexpire().Key(s).Milliseconds(stagedTTL.Milliseconds()).Build())
		}
		// A rebuild leaves no give-back and no transfer on the move: the
		// counters and the stock are MySQL's.
		for _, key := range []string{t.giveBack(), t.xout, t.xin} {
			if key != "" {
				cmds = append(cmds, c.B().Del().Key(t.staged(key)).Build())
				add(key, time.Time{})
			}
		}
		regions, stock := t.StockKeys()
		for i, r := range regions {
			s := add(stock[i], time.Time{})
			cmds = append(cmds, c.B().Set().Key(s).Value(strconv.FormatInt(b.Stock[r], 10)).Px(stagedTTL).Build())
		}
		for _, w := range slices.Sorted(maps.Keys(b.Limits)) {
			if err := counts(t.Limit(w), b.Limits[w], b.LimitEnd[w]); err != nil {
				return nil, err
			}
		}
	}
	// meta last among the pairs: install renames it into place after the rest
	// (within the one script, so the order only matters for reading).
	s := add(t.Meta, time.Time{})
	meta := c.B().Hset().Key(s).FieldValue()
	for i := 0; i+1 < len(b.Meta); i += 2 {
		meta = meta.FieldValue(b.Meta[i], b.Meta[i+1])
	}
	cmds = append(cmds, c.B().Del().Key(s).Build(), meta.Build(), c.B().Pexpire().Key(s).Milliseconds(stagedTTL.Milliseconds()).Build())
	return pairs, flush()
}

// sendAll sends cmds in one round trip and answers the first error.
func sendAll(ctx context.Context, c rueidis.Client, cmds rueidis.Commands) error {
	if len(cmds) == 0 {
		return nil
	}
	for _, r := range c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return err
		}
	}
	return nil
}
