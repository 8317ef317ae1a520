-- claim: the backend takes orders it is about to write to MySQL, so that a gateway
-- whose publish "failed" (but got through) can no longer release them.
-- KEYS: 1 orders
-- ARGV: order ids
-- Returns one status per id:
--   'ok'        claimed now or before
--   'released'  the gateway released it: drop the message
--   'unknown'   Redis has no record (e.g. it lost its data): MySQL's guard decides
local out = {}
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
