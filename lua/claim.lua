-- claim: the backend takes orders it is about to write to MySQL, so that a gateway
-- whose publish "failed" (but got through) can no longer release them.
-- KEYS: 1 orders, 2 meta, 3 epoch (of the same tag; meta and epoch only read)
-- ARGV: order ids
-- Returns one status per id, then the tag's epoch as the claim read it:
--   'ok'        claimed now or before
--   'released'  the gateway released it: drop the message
--   'unknown'   Redis has no record, in a warm tag (it lost its data, and the
--               rebuild since found no trace of the order): MySQL's guard decides
--   'cold'      the tag is not warm (it lost its data, or a rebuild is under
--               way): nothing is decided until the rebuild has read the stream;
--               a gateway releasing the order meanwhile leaves a tombstone the
--               rebuild keeps, and the order is then 'released', not written
-- The epoch (empty when the tag has none) is why the backend decides on these
-- answers only while the sale is still in that epoch: a rebuild since may have
-- installed what they did not see.
local out = {}
local epoch = redis.call('GET', KEYS[3]) or ''
if redis.call('EXISTS', KEYS[2]) == 0 then
  for i = 1, #ARGV do
    out[i] = 'cold'
  end
  out[#ARGV + 1] = epoch
  return out
end
for i, id in ipairs(ARGV) do
  local ord = redis.call('HGET', KEYS[1], id)
  if not ord then
    out[i] = 'unknown'
  else
    local st = string.match(ord, '^([^|]*)')
    if st == 'released' then
      out[i] = 'released'
    else
      if st == 'pending' then
        redis.call('HSET', KEYS[1], id, 'processing' .. string.sub(ord, #st + 1))
      end
      out[i] = 'ok'
    end
  end
end
out[#ARGV + 1] = epoch
return out
