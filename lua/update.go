package lua

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
)

// updateScript changes a warm sale's spec in place, refusing what would
// invalidate a count already taken, in one call so no admission slips between
// the check and the change:
//
//	KEYS: 1 meta, 2 users hash, 3 stock, then the current window's counter
//	      hash of each purchase limit whose max goes down
//	ARGV: 1 the new per_user_limit, 2 the stock delta (total's change), 3 the
//	      number n of lowered limits, then n pairs (limit index, new max), then
//	      meta field/value pairs
//
// Answers {"not_warm"}, {"over_limit", most units one buyer holds},
// {"stock", units left}, {"over_max", limit index, most one subject has
// used} or {"ok"}.
var updateScript = rueidis.NewLuaScript(`if redis.call('EXISTS', KEYS[1]) == 0 then return {'not_warm'} end
local limit = tonumber(ARGV[1])
if limit < tonumber(redis.call('HGET', KEYS[1], 'limit') or '0') then
  local most = 0
  for _, v in ipairs(redis.call('HVALS', KEYS[2])) do
    local n = tonumber(v)
    if n > most then most = n end
  end
  if most > limit then return {'over_limit', tostring(most)} end
end
local delta = tonumber(ARGV[2])
if delta < 0 then
  local left = tonumber(redis.call('GET', KEYS[3]) or '0')
  if left + delta < 0 then return {'stock', tostring(left)} end
end
local n = tonumber(ARGV[3])
for i = 1, n do
  local prefix, max = ARGV[2 + 2 * i] .. '/', tonumber(ARGV[3 + 2 * i])
  local kv = redis.call('HGETALL', KEYS[3 + i])
  for j = 1, #kv, 2 do
    if string.sub(kv[j], 1, #prefix) == prefix and tonumber(kv[j + 1]) > max then
      return {'over_max', ARGV[2 + 2 * i], kv[j + 1]}
    end
  end
end
if delta ~= 0 then redis.call('INCRBY', KEYS[3], delta) end
local fields = {}
for j = 4 + 2 * n, #ARGV do fields[#fields + 1] = ARGV[j] end
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

// Update puts s, the new spec of a warm sale without regions, in its meta
// hash and moves its stock by delta units, unless a buyer already holds more
// than s.PerUserLimit (ErrOverLimit), fewer than -delta units are free
// (ErrStockTaken), or a subject has used more of a lowered purchase limit in
// its current window than the new max (ErrOverMax); the error then says how
// many. A sale Redis does not hold is left alone (ErrNotWarmed): warming it
// later reads MySQL's spec. Lowering a limit reads every counter of that
// window in the one call: O(subjects), so not at the peak of a sale.
func Update(ctx context.Context, c rueidis.Client, s *flashgate.Sale, delta int64, lowered []Lowered) error {
	k := KeysFor(s.ID, nil)
	keys := []string{k.Meta, k.Users, k.stock}
	args := []string{strconv.FormatInt(s.PerUserLimit, 10), strconv.FormatInt(delta, 10), strconv.Itoa(len(lowered))}
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
	case res[0] == "stock" && len(res) == 2:
		return fmt.Errorf("%w: %s units are left unreserved", ErrStockTaken, res[1])
	case res[0] == "over_max" && len(res) == 3:
		return fmt.Errorf("%w: limit %s: one subject has used %s", ErrOverMax, res[1], res[2])
	case res[0] != "ok":
		return fmt.Errorf("update %s: answer %v", s.ID, res)
	}
	// The live index orders sales by their end: a new ends_at moves the sale.
	if err := indexSale(ctx, c, s); err != nil {
		return fmt.Errorf("update %s: index: %w", s.ID, err)
	}
	return nil
}
