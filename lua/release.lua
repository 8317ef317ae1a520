-- release: undo one admission (stock back, user counter down, reservation gone),
-- exactly once however often it is called.
-- KEYS: 1 stock (the order's region's, or the sale's), 2 users, 3 resv, 4 orders, 5 idem,
--       6 give-backs (Keys.giveBack), 7 epoch, 7+i: the counter hash of window i of the
--       order's charges
-- ARGV: 1 order id, 2 mode ('gateway' | 'backend'), 3 reason, 4 expected region ('' = none),
--       5 the fields ('<limit>/<subject>', comma-separated) counted in another bucket
--       ('' = none), 6 the epoch MySQL decided in (backend mode; '0': unchecked),
--       6+i: the name of window i (KEYS[7+i] is its counter hash)
-- The charges undone are the ones the reservation records (what admit counted). A charge
-- counted in another bucket (a sale with buckets, docs/buckets.md) is not undone here: it
-- goes into the give-backs hash under the order id, in this same step, and the caller
-- (or reconcile, after a crash) gives it back in its bucket (lua.giveBack).
-- mode 'gateway': the publish failed, so no order exists: the order becomes 'released'
--   (a tombstone the backend reads in claim) and the idempotency key is freed for a retry.
--   If the backend has already claimed the order the publish did get through: {'claimed'}.
-- mode 'backend': MySQL refused the order; it becomes 'failed' with the reason and keeps
--   its idempotency key (a replay shows the failed order).
-- mode 'backend' from an older epoch than the tag's (a rebuild counted MySQL's decision
--   already): {'fenced'}, nothing written.
-- Returns {'released', remaining} | {'claimed'} | {'already', status} | {'unknown'} | {'fenced'}
-- An order Redis has no record of answers 'unknown'. In gateway mode it also
-- leaves a tombstone in its place: a 'released' record of quantity 0 and no
-- user (status|reason||0|region|now|0||). The gateway releases an order it
-- answered 503 for; if the admission of that order is still on its way
-- (delayed behind a stall on another connection), admit.lua writes records
-- with HSETNX, so it meets the tombstone and answers duplicate_id: it reserves
-- nothing and the 503 stays a refusal (invariant 6), by a fence, not a timing.
local id, mode = ARGV[1], ARGV[2]
if mode == 'backend' and ARGV[6] ~= '0' and (redis.call('GET', KEYS[7]) or '') ~= ARGV[6] then
  return {'fenced'}
end
local ord = redis.call('HGET', KEYS[4], id)
if not ord then
  if mode == 'gateway' then
    local t = redis.call('TIME')
    local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
    redis.call('HSET', KEYS[4], id, 'released|' .. ARGV[3] .. '||0|' .. ARGV[4] .. '|' .. now .. '|0||')
  end
  return {'unknown'}
end
local st = string.match(ord, '^([^|]*)')
if mode == 'gateway' and st == 'processing' then
  return {'claimed'}
end
local rec = redis.call('HGET', KEYS[3], id)
if (st ~= 'pending' and st ~= 'processing') or not rec then
  if mode == 'gateway' and st == 'released' then
    -- Written again, unchanged: under redis.wait_replicas the WAIT after this
    -- call then covers the release itself, and a replay's 503 of this order
    -- is final (a failover cannot bring the order back, pending).
    redis.call('HSET', KEYS[4], id, ord)
  end
  return {'already', st}
end
local user, qty, region, idem = string.match(rec, '^([^|]*)|([^|]*)|([^|]*)|[^|]*|[^|]*|([^|]*)')
local charges = string.match(rec, '^[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|([^|]*)$') or ''
if region ~= ARGV[4] then
  return redis.error_reply('release: order ' .. id .. ' is in region "' .. region .. '"')
end
local win = {}
for i = 7, #ARGV do
  win[ARGV[i]] = KEYS[i + 1]
end
local remote = {}
for f in string.gmatch(ARGV[5] or '', '[^,]+') do
  remote[f] = true
end
local undo, away = {}, {}
for c in string.gmatch(charges, '[^,]+') do
  local lim, w, inc, subj = string.match(c, '^(%d+)/([^/]+)/(%d+)/(.+)$')
  if lim and remote[lim .. '/' .. subj] then
    away[#away + 1] = c
  elseif not win[w] then
    return redis.error_reply('release: order ' .. id .. ' counts in window "' .. tostring(w) .. '", no key given')
  else
    undo[#undo + 1] = {win[w], lim .. '/' .. subj, tonumber(inc)}
  end
end
qty = tonumber(qty)
redis.call('HDEL', KEYS[3], id)
local left = redis.call('INCRBY', KEYS[1], qty)
if redis.call('HINCRBY', KEYS[2], user, -qty) <= 0 then
  redis.call('HDEL', KEYS[2], user)
end
for _, u in ipairs(undo) do
  -- A window that has expired comes back as a lone negative field, deleted at once.
  if redis.call('HINCRBY', u[1], u[2], -u[3]) <= 0 then
    redis.call('HDEL', u[1], u[2])
  end
end
if #away > 0 then
  redis.call('HSET', KEYS[6], id, table.concat(away, ','))
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
