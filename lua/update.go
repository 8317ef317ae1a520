package lua

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
)

// updateScript changes a warm sale's spec in place, refusing what would
// invalidate a count already taken, in one call so no admission slips between
// the check and the change:
//
//	KEYS: 1 meta, 2 users hash, then m stock keys (the sale's, or regions'),
//	      then the current window's counter hash of each purchase limit whose
//	      max goes down
//	ARGV: 1 the new per_user_limit, 2 m, then m stock deltas (in the order of
//	      the stock keys), then the number n of lowered limits, then n pairs
//	      (limit index, new max), then meta field/value pairs
//
// Answers {"not_warm"}, {"over_limit", most units one buyer holds},
// {"stock", stock key index (1-based), units left}, {"over_max", limit index,
// most one subject has used} or {"ok"}.
var updateScript = newScript("update", `if redis.call('EXISTS', KEYS[1]) == 0 then return {'not_warm'} end
local limit = tonumber(ARGV[1])
if limit < tonumber(redis.call('HGET', KEYS[1], 'limit') or '0') then
  local most = 0
  for _, v in ipairs(redis.call('HVALS', KEYS[2])) do
    local n = tonumber(v)
    if n > most then most = n end
  end
  if most > limit then return {'over_limit', tostring(most)} end
end
local m = tonumber(ARGV[2])
for i = 1, m do
  local delta = tonumber(ARGV[2 + i])
  if delta < 0 then
    local left = tonumber(redis.call('GET', KEYS[2 + i]) or '0')
    if left + delta < 0 then return {'stock', tostring(i), tostring(left)} end
  end
end
local n = tonumber(ARGV[3 + m])
for i = 1, n do
  local prefix, max = ARGV[2 + m + 2 * i] .. '/', tonumber(ARGV[3 + m + 2 * i])
  local kv = redis.call('HGETALL', KEYS[2 + m + i])
  for j = 1, #kv, 2 do
    if string.sub(kv[j], 1, #prefix) == prefix and tonumber(kv[j + 1]) > max then
      return {'over_max', ARGV[2 + m + 2 * i], kv[j + 1]}
    end
  end
end
for i = 1, m do
  local delta = tonumber(ARGV[2 + i])
  if delta ~= 0 then redis.call('INCRBY', KEYS[2 + i], delta) end
end
local fields = {}
for j = 4 + m + 2 * n, #ARGV do fields[#fields + 1] = ARGV[j] end
redis.call('HSET', KEYS[1], unpack(fields))
return {'ok'}`)

// Errors of Update: what Redis holds refuses the change.
var (
	// ErrOverLimit: a buyer holds (or has reserved) more units than the new
	// per_user_limit.
	ErrOverLimit = errors.New("a buyer holds more than the new per_user_limit")
	// ErrStockTaken: the units the new total removes are reserved or sold.
	ErrStockTaken = errors.New("the units the new total removes are not free")
	// ErrOverMax: a subject has used more of a purchase limit than its new max.
	ErrOverMax = errors.New("a subject has used more than the new max")
)

// Lowered is a purchase limit whose max goes down: its index in the sale's
// limits, the window it counts now (flashgate.Window) and the new max.
type Lowered struct {
	Index  int
	Window string
	Max    int64
}

// Update puts s, the new spec of a warm sale, in its meta hash and moves its
// stock by deltas (region → units; "" for a sale without regions; a region
// absent is left alone), unless a buyer already holds more than
// s.PerUserLimit (ErrOverLimit), a region's stock holds fewer than the units
// its delta removes (ErrStockTaken), or a subject has used more of a lowered
// purchase limit in its current window than the new max (ErrOverMax); the
// error then says how many. A sale Redis does not hold is left alone
// (ErrNotWarmed): warming it later reads MySQL's spec. Lowering a limit reads
// every counter of that window in the one call: O(subjects), so not at the
// peak of a sale.
//
// On a sale split over buckets (s.BucketTags), see updateBucketed.
func Update(ctx context.Context, c rueidis.Client, s *flashgate.Sale, deltas map[string]int64, lowered []Lowered) error {
	return UpdateWait(ctx, c, s, deltas, lowered, 0, 0)
}

// UpdateWait is Update under redis.wait_replicas (replicas > 0): on a split
// sale, a lowering lands the transfers under way only once replicas
// replicas of each giver's master have the take (FinishTransfersWait).
func UpdateWait(ctx context.Context, c rueidis.Client, s *flashgate.Sale, deltas map[string]int64, lowered []Lowered, replicas int, timeout time.Duration) error {
	if len(s.BucketTags) > 1 {
		if err := updateBucketed(ctx, c, s, deltas, lowered, replication{replicas: replicas, timeout: timeout}); err != nil {
			return err
		}
	} else if err := updateOne(ctx, c, KeysOf(s), s, deltas, lowered); err != nil {
		return err
	}
	// The live index orders sales by their end: a new ends_at moves the sale.
	if err := indexSale(ctx, c, s); err != nil {
		return fmt.Errorf("update %s: index: %w", s.ID, err)
	}
	return nil
}

// updateOne runs updateScript on one hash tag's keys (a sale's, or one
// bucket's): the checks and the change of its meta and stock in one call.
func updateOne(ctx context.Context, c rueidis.Client, k *Keys, s *flashgate.Sale, deltas map[string]int64, lowered []Lowered) error {
	regions := make([]string, 0, len(deltas))
	for r, d := range deltas {
		if d != 0 {
			regions = append(regions, r)
		}
	}
	slices.Sort(regions)
	keys := []string{k.Meta, k.Users}
	args := []string{strconv.FormatInt(s.PerUserLimit, 10), strconv.Itoa(len(regions))}
	for _, r := range regions {
		stock, ok := k.Stock(r)
		if !ok {
			return fmt.Errorf("update %s: region %q: %w", s.ID, r, ErrUnknownRegion)
		}
		keys = append(keys, stock)
		args = append(args, strconv.FormatInt(deltas[r], 10))
	}
	args = append(args, strconv.Itoa(len(lowered)))
	for _, l := range lowered {
		keys = append(keys, k.Limit(l.Window))
		args = append(args, strconv.Itoa(l.Index), strconv.FormatInt(l.Max, 10))
	}
	args = append(args, metaFields(s)...)
	res, err := updateScript.Exec(ctx, c, keys, args).AsStrSlice()
	if err != nil {
		return fmt.Errorf("update %s: %w", s.ID, err)
	}
	switch {
	case len(res) == 0:
		return fmt.Errorf("update %s: empty answer", s.ID)
	case res[0] == "not_warm":
		return ErrNotWarmed
	case res[0] == "over_limit" && len(res) == 2:
		return fmt.Errorf("%w: one holds %s units", ErrOverLimit, res[1])
	case res[0] == "stock" && len(res) == 3:
		i, _ := strconv.Atoi(res[1])
		if i < 1 || i > len(regions) {
			return fmt.Errorf("update %s: answer %v", s.ID, res)
		}
		return fmt.Errorf("%w: %s units are left unreserved%s", ErrStockTaken, res[2], inRegion(regions[i-1]))
	case res[0] == "over_max" && len(res) == 3:
		return fmt.Errorf("%w: limit %s: one subject has used %s", ErrOverMax, res[1], res[2])
	case res[0] != "ok":
		return fmt.Errorf("update %s: answer %v", s.ID, res)
	}
	return nil
}

// inRegion names region in a message ("" for a sale without regions).
func inRegion(region string) string {
	if region == "" {
		return ""
	}
	return " in region " + region
}

// shiftScript moves one warm bucket's stock: up by ARGV[1] units (> 0), or
// down by as many of -ARGV[1] as it holds (< 0), never below 0.
//
//	KEYS: 1 the bucket's meta, 2 its stock key
//	ARGV: 1 the units (signed)
//
// Answers {"not_warm"} (the bucket's meta is gone: a master lost it; its
// refill and the stock repair give it its share from MySQL) or {"ok", units
// moved (unsigned)}.
var shiftScript = newScript("shift", `if redis.call('EXISTS', KEYS[1]) == 0 then return {'not_warm'} end
local d = tonumber(ARGV[1])
if d < 0 then
  local have = tonumber(redis.call('GET', KEYS[2]) or '0')
  local n = math.min(have, -d)
  if n <= 0 then return {'ok', '0'} end
  redis.call('DECRBY', KEYS[2], n)
  return {'ok', tostring(n)}
end
redis.call('INCRBY', KEYS[2], d)
return {'ok', tostring(d)}`)

// shift runs shiftScript on bucket b's stock of region: the units it moved.
func shift(ctx context.Context, c rueidis.Client, b *Keys, region string, units int64) (int64, error) {
	stock, ok := b.Stock(region)
	if !ok {
		return 0, ErrUnknownRegion
	}
	res, err := shiftScript.Exec(ctx, c, []string{b.Meta, stock}, []string{strconv.FormatInt(units, 10)}).AsStrSlice()
	if err != nil {
		return 0, fmt.Errorf("update %s bucket %d: stock: %w", b.Sale, b.index, err)
	}
	switch {
	case len(res) == 1 && res[0] == "not_warm":
		return 0, ErrNotWarmed
	case len(res) == 2 && res[0] == "ok":
		return strconv.ParseInt(res[1], 10, 64)
	}
	return 0, fmt.Errorf("update %s bucket %d: stock: answer %v", b.Sale, b.index, res)
}

// lowerRounds bounds the passes over the buckets that gather a lowering's
// units while buyers take some of them meanwhile.
const lowerRounds = 3

// updateBucketed is Update for a sale split over buckets: each bucket holds
// a copy of the spec, its buyers' counts and a share of the stock, and no one
// script reaches them all, so the change goes bucket by bucket, each step
// atomic on its bucket, in an order that can always be undone:
//
//  1. A lowering of a stock (a delta < 0: the total's, or a region's) takes
//     its units from the buckets' stocks of it, the fullest first, each giving
//     what it holds (shiftScript): units reserved or sold are not in a stock,
//     so they are never taken. When the buckets together hold fewer free
//     units than asked (read first, and again when buyers took them
//     meanwhile), the units taken go back to the buckets they came from and
//     the answer is ErrStockTaken.
//  2. Every bucket's meta takes the new spec with its own checks
//     (updateScript: no buyer of it over a lowered per_user_limit, no subject
//     over a lowered limit's max). A refusal puts the old spec back into the
//     buckets already changed and the units of step 1 back into theirs: the
//     sale is as it was.
//  3. A raise (a delta > 0) is shared over the buckets (SplitUnits), and a
//     bucket whose meta is gone gives its share to the next one.
//  4. The sale's own meta takes the new spec (gateways read it).
//
// Between the first bucket's change and the last one's the buckets disagree
// on the spec for the few calls it takes; each buyer is judged by one bucket,
// the home, so no one meets both. A bucket a master lost (no meta) is left
// alone: its refill copies the spec from MySQL and the stock repair gives it
// its share. A process dying half way leaves MySQL unchanged (its transaction
// commits after this) and Redis partly changed; the stock repair sets each
// bucket from MySQL's figures, and the next PATCH writes the spec again.
func updateBucketed(ctx context.Context, c rueidis.Client, s *flashgate.Sale, deltas map[string]int64, lowered []Lowered, w replication) error {
	k := KeysOf(s)
	if n, err := c.Do(ctx, c.B().Exists().Key(k.Meta).Build()).AsInt64(); err != nil {
		return fmt.Errorf("update %s: %w", s.ID, err)
	} else if n == 0 {
		return ErrNotWarmed
	}
	old, err := LoadSale(ctx, c, s.ID)
	if err != nil {
		return fmt.Errorf("update %s: %w", s.ID, err)
	}
	regions := make([]string, 0, len(deltas))
	for r, d := range deltas {
		if _, ok := k.Stock(r); !ok {
			return fmt.Errorf("update %s: region %q: %w", s.ID, r, ErrUnknownRegion)
		}
		if d != 0 {
			regions = append(regions, r)
		}
	}
	slices.Sort(regions)
	// taken[r][i]: the units of region r bucket i gave to a lowering.
	taken := map[string][]int64{}
	giveBack := func() {
		for r, units := range taken {
			for i, n := range units {
				if n > 0 {
					// Adding units back cannot be refused (but by a bucket
					// lost meanwhile, which the stock repair refills from MySQL).
					_, _ = shift(context.WithoutCancel(ctx), c, k.buckets[i], r, n)
				}
			}
		}
	}
	for _, r := range regions {
		if deltas[r] >= 0 {
			continue
		}
		taken[r] = make([]int64, len(k.buckets))
		if err := lowerBuckets(ctx, c, k, r, -deltas[r], taken[r], w); err != nil {
			giveBack()
			return err
		}
	}
	for i, b := range k.buckets {
		err := updateOne(ctx, c, b, s, nil, lowered)
		if err == nil || errors.Is(err, ErrNotWarmed) {
			continue
		}
		for _, done := range k.buckets[:i] {
			if uerr := updateOne(context.WithoutCancel(ctx), c, done, old, nil, nil); uerr != nil && !errors.Is(uerr, ErrNotWarmed) {
				err = fmt.Errorf("%w (and bucket %d kept the new spec: %v)", err, done.index, uerr)
			}
		}
		giveBack()
		return fmt.Errorf("%w (bucket %d)", err, i)
	}
	for _, r := range regions {
		if deltas[r] <= 0 {
			continue
		}
		var carry int64
		for i, b := range k.buckets {
			share := SplitUnits(deltas[r], len(k.buckets), i) + carry
			if share == 0 {
				continue
			}
			_, err := shift(ctx, c, b, r, share)
			switch {
			case errors.Is(err, ErrNotWarmed):
				carry = share
			case err != nil:
				return err
			default:
				carry = 0
			}
		}
	}
	// The sale's own meta: no stock and no buyers under its tag.
	return updateOne(ctx, c, k, s, nil, nil)
}

// lowerBuckets takes want units of region from the buckets' stocks (taken[i]:
// what bucket i gave), or fails with ErrStockTaken when they do not hold that
// many free units; the caller gives taken back.
//
// Units on the move between buckets are in no stock: they are landed first,
// each only once w.replicas replicas of its giver's master have the take
// (finishTransfers, as reconcile lands them): one landed on a take a
// failover could lose would be counted twice. The units of a take not
// confirmed stay in their ledger, counted by Remaining and by no stock here.
func lowerBuckets(ctx context.Context, c rueidis.Client, k *Keys, region string, want int64, taken []int64, w replication) error {
	if _, err := finishTransfers(ctx, c, k, 0, w); err != nil {
		return err
	}
	var free int64 // what the buckets held at the last read, less what was taken since
	for round := 0; round < lowerRounds && want > 0; round++ {
		stock, err := bucketStock(ctx, c, k)
		if err != nil {
			return err
		}
		order := make([]int, len(k.buckets))
		free = 0
		for i := range order {
			order[i] = i
			free += stock[i][region]
		}
		if free < want {
			break
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(stock[b][region], stock[a][region]) })
		for _, i := range order {
			if want == 0 || stock[i][region] <= 0 {
				break
			}
			got, err := shift(ctx, c, k.buckets[i], region, -min(want, stock[i][region]))
			if err != nil && !errors.Is(err, ErrNotWarmed) {
				return err
			}
			taken[i] += got
			want -= got
			free -= got
		}
	}
	if want > 0 {
		var held int64
		for _, n := range taken {
			held += n
		}
		return fmt.Errorf("%w: %d units are left unreserved over the buckets%s", ErrStockTaken, free+held, inRegion(region))
	}
	return nil
}
