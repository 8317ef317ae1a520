-- release: undo one admission (stock back, user counter down, reservation gone),
-- exactly once however often it is called.
-- KEYS: 1 stock (the order's region's, or the sale's), 2 users, 3 resv, 4 orders, 5 idem
-- ARGV: 1 order id, 2 mode ('gateway' | 'backend'), 3 reason, 4 expected region ('' = none)
-- mode 'gateway': the publish failed, so no order exists: the order becomes 'released'
--   (a tombstone the backend reads in claim) and the idempotency key is freed for a retry.
--   If the backend has already claimed the order the publish did get through: {'claimed'}.
-- mode 'backend': MySQL refused the order; it becomes 'failed' with the reason and keeps
--   its idempotency key (a replay shows the failed order).
-- Returns {'released', remaining} | {'claimed'} | {'already', status} | {'unknown'}
local id, mode = ARGV[1], ARGV[2]
local ord = redis.call('HGET', KEYS[4], id)
if not ord then
  return {'unknown'}
end
local st = string.match(ord, '^([^|]*)')
if mode == 'gateway' and st == 'processing' then
  return {'claimed'}
end
local rec = redis.call('HGET', KEYS[3], id)
if (st ~= 'pending' and st ~= 'processing') or not rec then
  return {'already', st}
end
local user, qty, region, idem = string.match(rec, '^([^|]*)|([^|]*)|([^|]*)|[^|]*|[^|]*|([^|]*)$')
if region ~= ARGV[4] then
  return redis.error_reply('release: order ' .. id .. ' is in region "' .. region .. '"')
end
qty = tonumber(qty)
redis.call('HDEL', KEYS[3], id)
local left = redis.call('INCRBY', KEYS[1], qty)
if redis.call('HINCRBY', KEYS[2], user, -qty) <= 0 then
  redis.call('HDEL', KEYS[2], user)
end
local status = 'failed'
if mode == 'gateway' then
  status = 'released'
  if idem ~= '' then
    redis.call('HDEL', KEYS[5], user .. '|' .. idem)
  end
end
redis.call('HSET', KEYS[4], id, status .. '|' .. ARGV[3] .. '|' .. rec)
return {'released', tostring(left)}
