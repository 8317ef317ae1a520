// Package lua owns the Redis side of admission: the key layout of a sale, the Lua
// scripts in this folder (embedded, loaded once, called with EVALSHA) and their Go
// bindings. Every key one call touches carries the sale's hash tag (keys.go), so one
// script on one shard decides it atomically, on a single Redis and on Redis Cluster
// alike.
package lua

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
)

var (
	//go:embed admit.lua
	admitSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed claim.lua
	claimSrc string
	//go:embed confirm.lua
	confirmSrc string
	//go:embed warm.lua
	warmSrc string

	// The positions a script only reads (meta, epoch) travel outside KEYS
	// (Script.read): the gateway may not write them.
	admitScript   = newScript("admit", admitSrc).reading(1)
	releaseScript = newScript("release", releaseSrc).reading(7)
	claimScript   = newScript("claim", claimSrc).reading(2, 3)
	confirmScript = newScript("confirm", confirmSrc).reading(3)
	warmScript    = newScript("warm", warmSrc)
)

// Scripts holds the scripts, functions of the library (library.go): each is
// called with FCALL, and loaded again where Redis lost it, by a caller that
// may (a restarted or new shard).
type Scripts struct {
	admit, release, claim, confirm, warm *Script
	// wait is redis.wait_replicas for the repairs that land transfers
	// between buckets (resetBucketed): none for Load.
	wait replication
}

// LoadWait is Load for a process under redis.wait_replicas: the stock repair
// of a split sale lands a transfer only once replicas replicas of its
// giver's master have the take (as FinishTransfersWait).
func LoadWait(replicas int, timeout time.Duration) *Scripts {
	s := Load()
	s.wait = replication{replicas: replicas, timeout: timeout}
	return s
}

// Load prepares the scripts; it does no I/O.
func Load() *Scripts {
	return &Scripts{
		admit:   admitScript,
		release: releaseScript,
		claim:   claimScript,
		confirm: confirmScript,
		warm:    warmScript,
	}
}

// AdmitFunction is the name Redis knows the admission function by (for
// operators and tests that watch Redis: MONITOR, SLOWLOG, LATENCY).
func AdmitFunction() string { return FunctionName("admit") }

// Outcome is what the admit script decided.
type Outcome uint8

const (
	Admitted Outcome = iota + 1
	Replayed
	NotWarmed
	NotStarted
	Ended
	BadQuantity
	LimitReached
	SoldOut
	DuplicateID
	// Paused: the sale is paused (docs/runbook.md); nothing was reserved.
	Paused
)

// admitWire is the word admit.lua returns for each Outcome (TestScriptOutcomes
// holds this table and the script to each other).
var admitWire = [...]string{Admitted: "ok", Replayed: "replay", NotWarmed: "not_warmed", NotStarted: "not_started",
	Ended: "ended", BadQuantity: "bad_quantity", LimitReached: "limit_reached", SoldOut: "sold_out", DuplicateID: "duplicate_id",
	Paused: "paused"}

func (o Outcome) String() string {
	if int(o) < len(admitWire) {
		return admitWire[o]
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// fromWire finds word in a script's table of outcome words (index 0 is no
// outcome); 0 for a word the table lacks. A scan, not a map: the tables are
// short, and the admission reply is parsed on the hot path without allocating.
func fromWire[T ~uint8](table []string, word string) T {
	for i := 1; i < len(table); i++ {
		if table[i] == word {
			return T(i)
		}
	}
	return 0
}

// AdmitArgs is one purchase to decide.
type AdmitArgs struct {
	User     string
	Quantity int64
	OrderID  uint64 // used when admitted; a replay answers the earlier id
	// Now is the caller's clock: it names the windows of the charges and
	// sets PayBy, and decides nothing in Redis (the scripts read TIME).
	Now     time.Time
	IdemKey string // "" for none
	Region  string // "" for a sale without regions
	PayBy   time.Time
	// Charges are what the order counts against the sale's Limits (see
	// flashgate.Sale.Charges), one per limit in order; the script checks each
	// against the maximum the sale's meta holds. Limits (the caller's copy of
	// the sale's) only names which limit a refusal was by: its Max is not
	// sent.
	Charges []flashgate.Charge
	Limits  []flashgate.Limit
	// EncodedCharges is flashgate.EncodeCharges(Charges) if the caller has it
	// already ("": Admit encodes them).
	EncodedCharges string
}

// Admission is the script's decision.
type Admission struct {
	Outcome   Outcome
	OrderID   uint64 // Admitted, Replayed
	Remaining int64  // Admitted, SoldOut: units left in the stock key
	// At (Admitted) is the admission's time by the Redis master that decided
	// it: the created time of the order's record and reservation, which
	// every age of the reservation is judged against (invariant 8). The
	// order's message carries it too; its payment deadline is PayBy's
	// distance from Now, counted from At (as the record has it).
	At   time.Time
	Wait time.Duration // NotStarted: time until the start
	// LimitReached: the limit that refused, an index into AdmitArgs.Limits, or
	// -1 for per_user_limit; Held is what its subject held already.
	Limit int
	Held  int64
}

// ErrUnknownRegion is returned for a region the sale's keys do not have.
var ErrUnknownRegion = errors.New("unknown region")

// Admit runs the admission script for one purchase.
func (s *Scripts) Admit(ctx context.Context, c rueidis.Client, k *Keys, a AdmitArgs) (Admission, error) {
	keys, args, err := admitCall(k, a)
	if err != nil {
		return Admission{}, err
	}
	return admitted(k, a, s.admit.Exec(ctx, c, keys, args))
}

// ErrNotReplicated is the answer of a write under redis.wait_replicas that
// fewer replicas than asked for had received within the wait (an admission,
// a claim, a gateway's release): a failover now could lose it, so nothing
// may be promised or decided on it. The write itself stands on the master; it
// is idempotent, and the caller undoes it (an admission) or runs it again.
var ErrNotReplicated = errors.New("not on enough replicas")

// ErrHoldLost is AdmitHeld's answer for an admission whose purchase-limit
// hold in another bucket was gone when it came to keep it (that bucket's
// master lost its data in between): the order's charges there are counted
// nowhere, so it is not promised. As with ErrNotReplicated, the caller
// releases the order.
var ErrHoldLost = errors.New("purchase-limit hold lost")

// AdmitWait runs the admission script, then WAIT replicas timeout on the same
// connection, in one round trip: Redis's WAIT counts the replicas that have
// every write of its own connection so far, so it must follow the script on
// that connection (rueidis sends a multi holding a blocking command on one
// dedicated connection, in order, to the node of the keyed command's slot).
// An admission that fewer replicas had within timeout comes back with
// ErrNotReplicated; the caller undoes it.
func (s *Scripts) AdmitWait(ctx context.Context, c rueidis.Client, k *Keys, a AdmitArgs, replicas int, timeout time.Duration) (Admission, error) {
	keys, args, err := admitCall(k, a)
	if err != nil {
		return Admission{}, err
	}
	wait := func() rueidis.Completed {
		return c.B().Wait().Numreplicas(int64(replicas)).Timeout(timeout.Milliseconds()).Build()
	}
	rs := s.admit.execMulti(ctx, c, keys, args, wait)
	adm, err := admitted(k, a, rs[0])
	if err != nil || adm.Outcome != Admitted {
		return adm, err
	}
	n, err := rs[1].AsInt64()
	if err != nil {
		return adm, fmt.Errorf("admit %s: wait: %w", k.Sale, err)
	}
	if n < int64(replicas) {
		return adm, fmt.Errorf("admit %s: %w: %d of %d replicas within %v", k.Sale, ErrNotReplicated, n, replicas, timeout)
	}
	return adm, nil
}

// WaitRecord tells whether replicas replicas of the master holding order id's
// record (in home bucket h) have it, and everything written there before it:
// it writes the record again, unchanged (touchSrc: a write that follows the
// admission in the master's replication stream), and WAITs for that write
// on the same connection, in one round trip. false when the record is gone
// or fewer replicas had it within timeout.
//
// A replay of an idempotency key answers 202 with the key's first order: if
// that order's admission came back ErrNotReplicated (its buyer was told 503,
// and its undo may not have run yet), a failover could still lose it, so a
// replay must not promise it before the replicas have it, exactly as the
// admission would not have.
func WaitRecord(ctx context.Context, c rueidis.Client, h *Keys, id uint64, replicas int, timeout time.Duration) (bool, error) {
	if replicas <= 0 {
		return true, nil
	}
	r, acked, err := execWait(ctx, c, touchScript, []string{h.Orders}, []string{strconv.FormatUint(id, 10)},
		replication{replicas: replicas, timeout: timeout})
	if err != nil {
		return false, fmt.Errorf("wait for order %s/%d: %w", h.Sale, id, err)
	}
	n, err := r.AsInt64()
	if err != nil {
		return false, fmt.Errorf("wait for order %s/%d: %w", h.Sale, id, err)
	}
	return n == 1 && acked, nil
}

// admitCall is the admission script's keys and arguments for a.
func admitCall(k *Keys, a AdmitArgs) (keys, args []string, err error) {
	stock, ok := k.Stock(a.Region)
	if !ok {
		return nil, nil, ErrUnknownRegion
	}
	keys = []string{k.Meta, stock, k.Users, k.Resv, k.Orders, k.Idem}
	args = []string{a.User, strconv.FormatInt(a.Quantity, 10), strconv.FormatUint(a.OrderID, 10),
		strconv.FormatInt(a.Now.UnixMilli(), 10), a.IdemKey, a.Region, strconv.FormatInt(a.PayBy.UnixMilli(), 10)}
	if len(a.Charges) > 0 {
		enc := a.EncodedCharges
		if enc == "" {
			enc = flashgate.EncodeCharges(a.Charges)
		}
		args = append(args, enc)
		for _, ch := range a.Charges {
			if ch.Limit < 0 || ch.Limit >= len(a.Limits) {
				return nil, nil, fmt.Errorf("admit %s: charge of limit %d, the sale has %d", k.Sale, ch.Limit, len(a.Limits))
			}
			keys = append(keys, k.Limit(ch.Window))
			args = append(args, ch.Field(), strconv.FormatInt(ch.Inc, 10), strconv.FormatInt(ch.ExpiresAtMillis(), 10))
		}
	}
	return keys, args, nil
}

// admitted reads the admission script's answer.
func admitted(k *Keys, a AdmitArgs, r rueidis.RedisResult) (Admission, error) {
	res, err := r.ToArray()
	if err != nil {
		return Admission{}, fmt.Errorf("admit %s: %w", k.Sale, err)
	}
	adm, err := parseAdmission(res)
	if err == nil && adm.Outcome == LimitReached && adm.Limit >= 0 {
		if adm.Limit >= len(a.Charges) {
			return adm, fmt.Errorf("admit %s: refused by charge %d of %d", k.Sale, adm.Limit+1, len(a.Charges))
		}
		adm.Limit = a.Charges[adm.Limit].Limit
	}
	return adm, err
}

func parseAdmission(res []rueidis.RedisMessage) (Admission, error) {
	if len(res) == 0 {
		return Admission{}, errors.New("admit: empty reply")
	}
	code, err := res[0].ToString()
	if err != nil {
		return Admission{}, fmt.Errorf("admit: %w", err)
	}
	arg := func(i int) int64 {
		if i >= len(res) {
			return 0
		}
		v, _ := res[i].ToString()
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	a := Admission{Outcome: fromWire[Outcome](admitWire[:], code)}
	switch a.Outcome {
	case Admitted:
		a.OrderID, a.Remaining = uint64(arg(1)), arg(2)
		if len(res) > 3 {
			a.At = time.UnixMilli(arg(3)).UTC()
		}
	case Replayed:
		a.OrderID = uint64(arg(1))
	case NotStarted:
		a.Wait = time.Duration(arg(1)) * time.Millisecond
	case LimitReached:
		a.Held, a.Limit = arg(1), int(arg(2))-1
	case SoldOut:
		a.Remaining = arg(1)
	case NotWarmed, Ended, BadQuantity, DuplicateID, Paused:
	default:
		return a, fmt.Errorf("admit: unexpected reply %q", code)
	}
	return a, nil
}

// Release modes.
const (
	ReleaseGateway = "gateway" // the publish failed: no order exists
	ReleaseBackend = "backend" // MySQL refused the order: it ends failed
)

// ReleaseOutcome is what release.lua did.
type ReleaseOutcome uint8

const (
	// ReleaseDone: the units went back now.
	ReleaseDone ReleaseOutcome = iota + 1
	// ReleaseClaimed: gateway mode, and the backend had claimed the order.
	ReleaseClaimed
	// ReleaseAlready: the order was settled or released before (its status
	// comes with it).
	ReleaseAlready
	// ReleaseUnknown: Redis has no record of the order. In gateway mode the
	// release has left a tombstone in its place (release.lua), so an
	// admission of that id still on its way answers DuplicateID.
	ReleaseUnknown
	// ReleaseFenced: backend mode from an older epoch than the tag's
	// (Keys.AtEpoch): a rebuild counted MySQL's decision already; nothing
	// was written.
	ReleaseFenced
)

// releaseWire is the word release.lua returns for each ReleaseOutcome.
var releaseWire = [...]string{ReleaseDone: "released", ReleaseClaimed: "claimed", ReleaseAlready: "already", ReleaseUnknown: "unknown",
	ReleaseFenced: "fenced"}

func (o ReleaseOutcome) String() string {
	if int(o) < len(releaseWire) {
		return releaseWire[o]
	}
	return "release(" + strconv.Itoa(int(o)) + ")"
}

// The statuses the scripts write into an order's record beside MySQL's:
// admit writes pending, claim.lua processing, release.lua (gateway mode)
// released. Processing and released are Redis-only (MySQL never holds them).
const (
	StatusPending    = flashgate.OrderPending
	StatusProcessing = flashgate.OrderProcessing
	StatusReleased   = flashgate.OrderReleased
)

// ReleaseResult is what release did.
type ReleaseResult struct {
	Outcome   ReleaseOutcome
	Released  bool                  // units went back now
	Claimed   bool                  // gateway mode: the backend already took the order
	Status    flashgate.OrderStatus // the order's status when nothing was released
	Remaining int64                 // after a release: units in the stock key
	Unknown   bool                  // Redis has no record of the order
}

// Release undoes one admission, exactly once: its stock, its buyer's counter
// and each limit it was charged to. charges are the order's (as encoded in its
// message or record): they name the window counters the script may touch.
func (s *Scripts) Release(ctx context.Context, c rueidis.Client, k *Keys, orderID uint64, region, charges, mode, reason string) (ReleaseResult, error) {
	stock, ok := k.Stock(region)
	if !ok {
		return ReleaseResult{}, ErrUnknownRegion
	}
	windows, wkeys, err := k.windowKeys(charges)
	if err != nil {
		return ReleaseResult{}, fmt.Errorf("release %s/%d: %w", k.Sale, orderID, err)
	}
	away, err := k.awayFields(charges)
	if err != nil {
		return ReleaseResult{}, fmt.Errorf("release %s/%d: %w", k.Sale, orderID, err)
	}
	sid := strconv.FormatUint(orderID, 10)
	// A gateway's release (its answer is a 503, or a 202 if the order was
	// claimed) under redis.wait_replicas is answered only once the replicas
	// have it: a failover that lost the tombstone or the release would let
	// the backend claim and confirm the order its buyer was told 503 for.
	w := replication{}
	if mode == ReleaseGateway {
		w = s.wait
	}
	raw, acked, err := execWait(ctx, c, s.release,
		append([]string{stock, k.Users, k.Resv, k.Orders, k.Idem, k.giveBack(), k.Epoch}, wkeys...),
		append([]string{sid, mode, reason, region, away, k.callerEpoch()}, windows...), w)
	if err != nil {
		return ReleaseResult{}, fmt.Errorf("release %s/%d: %w", k.Sale, orderID, err)
	}
	res, err := raw.ToArray()
	if err != nil {
		return ReleaseResult{}, fmt.Errorf("release %s/%d: %w", k.Sale, orderID, err)
	}
	if !acked {
		return ReleaseResult{}, fmt.Errorf("release %s/%d: %w: fewer than %d replicas within %v", k.Sale, orderID, ErrNotReplicated, w.replicas, w.timeout)
	}
	if away != "" {
		// The charges counted in other buckets, left in the give-backs by the
		// release (now or by an earlier one that died before this step).
		if _, err := giveBack(ctx, c, k, []string{sid}); err != nil {
			return ReleaseResult{}, fmt.Errorf("release %s/%d: %w", k.Sale, orderID, err)
		}
	}
	code, _ := res[0].ToString()
	r := ReleaseResult{Outcome: fromWire[ReleaseOutcome](releaseWire[:], code)}
	switch r.Outcome {
	case ReleaseDone:
		r.Released = true
		v, _ := res[1].ToString()
		r.Remaining, _ = strconv.ParseInt(v, 10, 64)
	case ReleaseClaimed:
		r.Claimed = true
	case ReleaseAlready:
		st, _ := res[1].ToString()
		r.Status = flashgate.OrderStatus(st)
	case ReleaseUnknown:
		r.Unknown = true
	case ReleaseFenced:
	default:
		return r, fmt.Errorf("release: unexpected reply %q", code)
	}
	return r, nil
}

// ClaimStatus is what claim.lua answers for one order; its value is the
// script's word.
type ClaimStatus string

const (
	// ClaimOK: the backend holds the order (claimed now or before).
	ClaimOK ClaimStatus = "ok"
	// ClaimReleased: the gateway released it: the message is to be dropped.
	ClaimReleased ClaimStatus = "released"
	// ClaimUnknown: Redis has no record of it (it lost its data): MySQL's guard
	// decides.
	ClaimUnknown ClaimStatus = "unknown"
	// ClaimCold: the order's tag is not warm (Redis lost it, or a rebuild is
	// under way): the order waits for the rebuild.
	ClaimCold ClaimStatus = "cold"
)

// Claim marks orders as taken by the backend; it answers one claim status per id.
func (s *Scripts) Claim(ctx context.Context, c rueidis.Client, k *Keys, ids []uint64) ([]ClaimStatus, error) {
	st, _, err := s.ClaimEpoch(ctx, c, k, ids)
	return st, err
}

// ClaimEpoch is Claim that also answers the epoch of k's tag as the claim
// read it ("" when the tag has none): the answers hold in that epoch only, so
// the backend decides on them only while MySQL's sales.epoch is still that
// (a rebuild in between may have installed what they did not see).
func (s *Scripts) ClaimEpoch(ctx context.Context, c rueidis.Client, k *Keys, ids []uint64) ([]ClaimStatus, string, error) {
	args := make([]string, len(ids))
	for i, id := range ids {
		args[i] = strconv.FormatUint(id, 10)
	}
	// Under redis.wait_replicas the claim is decided on only once the
	// replicas have it: a failover that lost it would let a gateway whose
	// publish timed out release the order (503) that MySQL then confirms.
	r, acked, err := execWait(ctx, c, s.claim, []string{k.Orders, k.Meta, k.Epoch}, args, s.wait)
	if err != nil {
		return nil, "", fmt.Errorf("claim %s: %w", k.Sale, err)
	}
	out, err := r.AsStrSlice()
	if err != nil {
		return nil, "", fmt.Errorf("claim %s: %w", k.Sale, err)
	}
	if !acked {
		return nil, "", fmt.Errorf("claim %s: %w: fewer than %d replicas within %v", k.Sale, ErrNotReplicated, s.wait.replicas, s.wait.timeout)
	}
	if len(out) != len(ids)+1 {
		return nil, "", fmt.Errorf("claim %s: %d answers for %d orders", k.Sale, len(out)-1, len(ids))
	}
	st := make([]ClaimStatus, len(ids))
	for i, w := range out[:len(ids)] {
		switch st[i] = ClaimStatus(w); st[i] {
		case ClaimOK, ClaimReleased, ClaimUnknown, ClaimCold:
		default:
			return nil, "", fmt.Errorf("claim %s: unexpected reply %q", k.Sale, w)
		}
	}
	return st, out[len(ids)], nil
}

// Confirm ends the reservations of settled orders and writes their status
// (MySQL's outcome) and reason back. It answers how many reservations ended.
// On a split sale each order is confirmed in its buyer's home bucket.
func (s *Scripts) Confirm(ctx context.Context, c rueidis.Client, k *Keys, orders []flashgate.Order) (int64, error) {
	if len(k.buckets) > 0 {
		var total int64
		err := byHome(k, len(orders), func(i int) string { return orders[i].UserID }, func(b *Keys, at []int) error {
			part := make([]flashgate.Order, len(at))
			for j, i := range at {
				part[j] = orders[i]
			}
			n, err := s.Confirm(ctx, c, b, part)
			total += n
			return err
		})
		return total, err
	}
	args := make([]string, 0, 1+3*len(orders))
	args = append(args, k.callerEpoch())
	for i := range orders {
		o := &orders[i]
		args = append(args, strconv.FormatUint(o.ID, 10), string(o.Status), o.Reason+"|"+EncodeResv(o))
	}
	n, err := s.confirm.Exec(ctx, c, []string{k.Resv, k.Orders, k.Epoch}, args).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("confirm %s: %w", k.Sale, err)
	}
	if n < 0 {
		return 0, fmt.Errorf("confirm %s: %w", k.Sale, ErrStaleEpoch)
	}
	return n, nil
}

// warmOne runs warm.lua on one tag: meta, and the stock keys when stock is
// not nil (units per region).
func (s *Scripts) warmOne(ctx context.Context, c rueidis.Client, k *Keys, fields []string, stock func(string) int64) (int64, error) {
	keys := []string{k.Meta}
	args := append([]string{strconv.Itoa(len(fields) / 2)}, fields...)
	if stock != nil {
		regions, stockKeys := k.StockKeys()
		for i, r := range regions {
			keys = append(keys, stockKeys[i])
			args = append(args, strconv.FormatInt(stock(r), 10))
		}
	}
	n, err := s.warm.Exec(ctx, c, keys, args).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("warm %s: %w", k.Sale, err)
	}
	return n, nil
}

// warmReply is what warm.lua answers.
type warmReply int64

const (
	warmAlready warmReply = 0 // the sale was warm: nothing written
	warmDone    warmReply = 1 // it warmed the sale now
)

// Warm makes sale known to Redis with the given units left per stock key
// (region "" for a sale without regions). It answers false when the sale was
// warm already: nothing is overwritten then.
func (s *Scripts) Warm(ctx context.Context, c rueidis.Client, sale *flashgate.Sale, remaining map[string]int64) (bool, error) {
	k := KeysOf(sale)
	fields := metaFields(sale)
	// A split sale warms each bucket (its copy of meta and its share of the
	// stock) before the sale's own meta, whose presence means "warm": a warm
	// that dies half way is finished by the next, which leaves alone the
	// buckets warmed already.
	for _, b := range k.buckets {
		if _, err := s.warmOne(ctx, c, b, fields, func(r string) int64 {
			return SplitUnits(remaining[r], len(k.buckets), b.index)
		}); err != nil {
			return false, err
		}
	}
	var stock func(string) int64
	if len(k.buckets) == 0 {
		stock = func(r string) int64 { return remaining[r] }
	}
	n, err := s.warmOne(ctx, c, k, fields, stock)
	if err != nil {
		return false, err
	}
	if err := indexSale(ctx, c, sale); err != nil {
		return false, fmt.Errorf("warm %s: index: %w", sale.ID, err)
	}
	return warmReply(n) == warmDone, nil
}

func metaFields(s *flashgate.Sale) []string {
	state := "open"
	if s.Closed {
		state = "closed"
	}
	var limits []byte
	if len(s.Limits) > 0 {
		limits, _ = json.Marshal(s.Limits) // a slice of plain structs: cannot fail
	}
	regions := make([]string, 0, len(s.Regions))
	for _, r := range s.RegionNames() {
		regions = append(regions, r+":"+strconv.FormatInt(s.Regions[r], 10))
	}
	paused := "0"
	if s.Paused {
		paused = "1"
	}
	return []string{
		"state", state,
		"paused", paused,
		"starts", strconv.FormatInt(s.StartsAt.UnixMilli(), 10),
		"ends", strconv.FormatInt(s.EndsAt.UnixMilli(), 10),
		"limit", strconv.FormatInt(s.PerUserLimit, 10),
		"omax", strconv.FormatInt(s.PerOrderMax, 10),
		"total", strconv.FormatInt(s.Total, 10),
		"price", strconv.FormatInt(s.PriceCents, 10),
		"title", s.Title,
		"regions", strings.Join(regions, ","),
		"limits", string(limits),
		"lmax", limitMaxima(s.Limits),
		"tz", s.TimeZone,
		"degrade", s.Degrade,
		"drate", strconv.FormatInt(s.DegradeRate, 10),
		"buckets", strings.Join(s.BucketTags, ","),
	}
}

// limitMaxima is meta's "lmax": the limits' maxima in order, comma-separated,
// which the admission script checks charges against (not the caller's).
func limitMaxima(ls []flashgate.Limit) string {
	var b []byte
	for i, l := range ls {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, l.Max, 10)
	}
	return string(b)
}

// ErrStaleEpoch means a write-back was refused: a rebuild of the sale's books
// (backend/rebuild.go) opened a later epoch than the caller's (Keys.AtEpoch),
// or is under way, or Redis lost the tag. The rebuild reads MySQL after the
// decision was committed, so the decision is counted there: the caller has
// nothing left to do.
var ErrStaleEpoch = errors.New("a rebuild opened a later epoch")

// ErrNotWarmed means Redis holds no meta for the sale.
var ErrNotWarmed = errors.New("sale not warmed")

// LoadSale reads a sale's spec back from its meta hash.
func LoadSale(ctx context.Context, c rueidis.Client, sale string) (*flashgate.Sale, error) {
	m, err := c.Do(ctx, c.B().Hgetall().Key(KeysFor(sale, nil).Meta).Build()).AsStrMap()
	if err != nil {
		return nil, fmt.Errorf("load sale %s: %w", sale, err)
	}
	if len(m) == 0 {
		return nil, ErrNotWarmed
	}
	num := func(f string) int64 { n, _ := strconv.ParseInt(m[f], 10, 64); return n }
	s := &flashgate.Sale{
		ID:           sale,
		Title:        m["title"],
		PriceCents:   num("price"),
		Total:        num("total"),
		StartsAt:     time.UnixMilli(num("starts")).UTC(),
		EndsAt:       time.UnixMilli(num("ends")).UTC(),
		PerUserLimit: num("limit"),
		PerOrderMax:  num("omax"),
		TimeZone:     m["tz"],
		Closed:       m["state"] != "open",
		Paused:       m["paused"] == "1",
		Degrade:      m["degrade"],
		DegradeRate:  num("drate"),
	}
	if b := m["buckets"]; b != "" {
		s.BucketTags = strings.Split(b, ",")
		s.Buckets = len(s.BucketTags)
	}
	if l := m["limits"]; l != "" {
		if err := json.Unmarshal([]byte(l), &s.Limits); err != nil {
			return nil, fmt.Errorf("load sale %s: limits: %w", sale, err)
		}
	}
	if rs := m["regions"]; rs != "" {
		s.Regions = make(map[string]int64)
		for _, part := range strings.Split(rs, ",") {
			name, units, _ := strings.Cut(part, ":")
			s.Regions[name], _ = strconv.ParseInt(units, 10, 64)
		}
	}
	return s, nil
}

// closeScript marks a warm sale closed. A sale Redis does not know is left
// alone: a bare HSET would create a meta with only a state, which every later
// Warm would take for "warm already", so the sale could never be warmed again.
//
// It answers {closed (0|1), TIME}: the moment, by this master's clock, from
// which its admissions answer ended.
var closeScript = newScript("close", `local t = redis.call('TIME')
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, t[1], t[2]} end
redis.call('HSET', KEYS[1], 'state', 'closed')
return {1, t[1], t[2]}`)

// Close stops admissions for the sale at once: the script answers 'ended'. A
// sale that is not warm is left as it is (admissions answer not_warmed; warming
// it later from MySQL carries its closed state).
//
// A split sale is closed in each bucket (what admissions read) and then in
// its own meta.
func Close(ctx context.Context, c rueidis.Client, k *Keys) error {
	_, err := CloseAt(ctx, c, k)
	return err
}

// CloseAt is Close that also answers when the sale closed by Redis's clock:
// the latest TIME of the masters it closed (each bucket's, then the sale
// meta's). Every admission of the sale ran before it (on its master's
// clock), so an order's created time, which admit.lua stamps with that same
// clock, tells whether it was admitted before the close (invariant 8: the
// backend compares the two, never its own clock with a gateway's).
func CloseAt(ctx context.Context, c rueidis.Client, k *Keys) (time.Time, error) {
	var at time.Time
	for _, b := range append(slices.Clone(k.buckets), k) {
		v, err := closeScript.Exec(ctx, c, []string{b.Meta}, nil).AsStrSlice()
		if err != nil {
			return at, fmt.Errorf("close %s: %w", k.Sale, err)
		}
		if len(v) != 3 {
			return at, fmt.Errorf("close %s: answer %q", k.Sale, v)
		}
		sec, err1 := strconv.ParseInt(v[1], 10, 64)
		usec, err2 := strconv.ParseInt(v[2], 10, 64)
		if err1 != nil || err2 != nil {
			return at, fmt.Errorf("close %s: answer %q", k.Sale, v)
		}
		if t := time.Unix(sec, usec*1000).UTC(); t.After(at) {
			at = t
		}
	}
	return at, nil
}

// Remaining reads the units left per region ("" for a sale without regions).
// A missing stock key is reported as absent from the map.
//
// For a split sale it is the sum over the buckets, with the units of
// transfers under way (taken from one bucket, not yet landed in another).
func Remaining(ctx context.Context, c rueidis.Client, k *Keys) (map[string]int64, error) {
	if len(k.buckets) > 0 {
		return remainingBucketed(ctx, c, k)
	}
	regions, keys := k.StockKeys()
	vals, err := c.Do(ctx, c.B().Mget().Key(keys...).Build()).ToArray()
	if err != nil {
		return nil, fmt.Errorf("remaining %s: %w", k.Sale, err)
	}
	out := make(map[string]int64, len(keys))
	for i, v := range vals {
		if n, err := v.AsInt64(); err == nil {
			out[regions[i]] = n
		}
	}
	return out, nil
}

// IdemKnown reports whether a purchase with this idempotency key may be a
// replay that the admission must answer (two reads, no script): after a
// sell-out only a replay needs the admission. A sale that is not warmed
// counts as known: Redis may have lost the key with the rest of its data, and
// the warm brings it back before it writes meta, so the admission answers
// not_warmed (503) until then instead of a sold-out that forgets the order.
func IdemKnown(ctx context.Context, c rueidis.Client, k *Keys, user, key string) (bool, error) {
	rs := c.DoMulti(ctx,
		c.B().Hexists().Key(k.Idem).Field(user+"|"+key).Build(),
		c.B().Exists().Key(k.Meta).Build())
	known, err := rs[0].AsBool()
	if err != nil {
		return false, err
	}
	warm, err := rs[1].AsBool()
	if err != nil {
		return false, err
	}
	return known || !warm, nil
}

// Order reads one order's record; ok is false when Redis has none.
func Order(ctx context.Context, c rueidis.Client, k *Keys, id uint64) (flashgate.Order, bool, error) {
	v, err := c.Do(ctx, c.B().Hget().Key(k.Orders).Field(strconv.FormatUint(id, 10)).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return flashgate.Order{}, false, nil
	}
	if err != nil {
		return flashgate.Order{}, false, err
	}
	o, err := DecodeRecord(k.Sale, id, v)
	return o, err == nil, err
}

// MetaRebuilt is the field of a tag's meta that says when its books were
// last rebuilt (backend/rebuild.go): unix milliseconds by the clock of the
// tag's master, read after the rebuild's fence. Every order admitted on the
// tag after that moment has its record in the tag's orders hash.
const MetaRebuilt = "rebuilt"

// OrderSince is Order on a buyer's home tag k, with, in the same round trip,
// when the tag was last rebuilt (MetaRebuilt): the zero time when the tag is
// not warm, or its books were not made by a rebuild that recorded the time.
func OrderSince(ctx context.Context, c rueidis.Client, k *Keys, id uint64) (o flashgate.Order, ok bool, rebuilt time.Time, err error) {
	rs := c.DoMulti(ctx,
		c.B().Hget().Key(k.Orders).Field(strconv.FormatUint(id, 10)).Build(),
		c.B().Hget().Key(k.Meta).Field(MetaRebuilt).Build())
	switch at, err := rs[1].AsInt64(); {
	case rueidis.IsRedisNil(err):
	case err != nil:
		return o, false, rebuilt, err
	default:
		rebuilt = time.UnixMilli(at).UTC()
	}
	v, err := rs[0].ToString()
	if rueidis.IsRedisNil(err) {
		return o, false, rebuilt, nil
	}
	if err != nil {
		return o, false, rebuilt, err
	}
	o, err = DecodeRecord(k.Sale, id, v)
	return o, err == nil, rebuilt, err
}

// Reservations reads every open reservation of the sale (admitted, not settled).
// A split sale's are read from every bucket.
func Reservations(ctx context.Context, c rueidis.Client, k *Keys) (map[uint64]flashgate.Order, error) {
	if len(k.buckets) > 0 {
		all := map[uint64]flashgate.Order{}
		for _, b := range k.buckets {
			part, err := Reservations(ctx, c, b)
			if err != nil {
				return nil, err
			}
			for id, o := range part {
				all[id] = o
			}
		}
		return all, nil
	}
	m, err := c.Do(ctx, c.B().Hgetall().Key(k.Resv).Build()).AsStrMap()
	if err != nil {
		return nil, fmt.Errorf("reservations %s: %w", k.Sale, err)
	}
	out := make(map[uint64]flashgate.Order, len(m))
	for id, v := range m {
		n, err := strconv.ParseUint(id, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("reservations %s: id %q", k.Sale, id)
		}
		if out[n], err = DecodeResv(k.Sale, n, v); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// pauseScript sets a warm sale's meta 'paused' ('1' or '0'); like
// closeScript it leaves a sale Redis does not know alone (a warm from MySQL
// carries the pause). It answers 1 if the meta was there.
var pauseScript = newScript("pause", `if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'paused', ARGV[1])
return 1`)

// SetPaused pauses (admissions answer paused and reserve nothing) or resumes
// the sale: each bucket of a split sale (what admissions read), then the
// sale's meta.
func SetPaused(ctx context.Context, c rueidis.Client, k *Keys, paused bool) error {
	v := "0"
	if paused {
		v = "1"
	}
	for _, b := range append(slices.Clone(k.buckets), k) {
		if err := pauseScript.Exec(ctx, c, []string{b.Meta}, []string{v}).Error(); err != nil {
			return fmt.Errorf("pause %s: %w", k.Sale, err)
		}
	}
	return nil
}
