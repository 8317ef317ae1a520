-- claim: the backend takes orders it is about to write to MySQL, so that a gateway
-- whose publish "failed" (but got through) can no longer release them.
-- KEYS: 1 orders, 2 meta (of the same tag)
-- ARGV: order ids
-- Returns one status per id:
--   'ok'        claimed now or before
--   'released'  the gateway released it: drop the message
--   'unknown'   Redis has no record, in a warm tag (it lost its data, and the
--               rebuild since found no trace of the order): MySQL's guard decides
--   'cold'      the tag is not warm (it lost its data, or a rebuild is under
--               way): nothing is decided until the rebuild has read the stream;
--               a gateway releasing the order meanwhile leaves a tombstone the
--               rebuild keeps, and the order is then 'released', not written
local out = {}
if redis.call('EXISTS', KEYS[2]) == 0 then
  for i = 1, #ARGV do
    out[i] = 'cold'
  end
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
return out
