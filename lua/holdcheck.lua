-- holdcheck: on an order's home bucket, tell whether the admission of orders
-- whose holds were left undecided (a crash between hold.lua and admit.lua)
-- took place, and make sure one that did not never will.
-- KEYS: 1 orders
-- ARGV: 1 n, then n pairs: order id, the record to write if there is none (a
--       'released' record whose reason is ARGV[2 + 2n], the tombstone reason)
-- An id with no record gets the tombstone (HSETNX): admit.lua writes an
-- order's record with HSETNX too, so a late admission of that id answers
-- duplicate_id and counts nothing. A tombstone release.lua left (a gateway
-- released the order before its admission ran) is read the same way.
-- Returns one word per id:
--   'admitted'  a real record is there: the order exists, its hold is its count
--   'aborted'   no order, now or ever: its hold is to be given back
local n = tonumber(ARGV[1])
local reason = ARGV[2 + 2 * n]
local out = {}
for j = 1, n do
  local id, tomb = ARGV[2 * j], ARGV[2 * j + 1]
  if redis.call('HSETNX', KEYS[1], id, tomb) == 1 then
    out[j] = 'aborted'
  else
    local st, why, qty = string.match(redis.call('HGET', KEYS[1], id), '^([^|]*)|([^|]*)|[^|]*|([^|]*)|')
    -- Its own tombstone (the reason), or release.lua's for an order it did
    -- not know (quantity 0: no order ever has it): no order, ever.
    if st == 'released' and (why == reason or qty == '0') then
      out[j] = 'aborted'
    else
      out[j] = 'admitted'
    end
  end
end
return out
