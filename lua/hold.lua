-- hold: the first step of an admission on a sale with buckets whose purchase
-- limits count by a subject (phone, device, ip, address, or another user) that
-- lives in another bucket than the buyer's home (docs/buckets.md, "Purchase
-- limits by phone, device, IP or address"). Run on the bucket holding the
-- counters (HomeBucket of each subject): every charge is checked against the
-- sale's maximum (this bucket's copy of meta) and counted, and the hold is
-- recorded under the order id, in one step. The admission on the home bucket
-- follows; the hold is then kept (unhold.lua 'keep') or given back ('give').
-- A hold left undecided by a crash is reconcile's (lua.FinishHolds).
-- KEYS: 1 meta (this bucket's copy), 2 holds (Keys.holds), then 2+j: the
--       counter hash of charge j's window
-- ARGV: 1 order id, 2 the gateway's now (ms; no decision reads it), 3 user,
--       4 quantity, 5 region ('' = none),
--       6 the charges held here, as flashgate.EncodeCharges wrote them,
--       then for each charge j, 3 values: field ('<limit>/<subject>'),
--       increment, when the window's counter expires (Unix ms; 0: no expiry)
-- As in admit.lua, time is this server's (TIME): the sale window, the
-- counters' expiry, and the hold's time in its entry, which reconcile ages
-- against this same clock (lua.HoldGrace).
-- Returns {'held'} | {'not_warmed'} | {'ended'} | {'not_started', ms_left} |
--   {'bad_quantity'} | {'limit_reached', held, limit index} | {'duplicate_id'} | {'paused'}
-- Every answer but 'held' leaves Redis as it was.
local meta = redis.call('HMGET', KEYS[1], 'state', 'starts', 'ends', 'omax', 'lmax', 'paused')
if not meta[1] then
  return {'not_warmed'}
end
local qty = tonumber(ARGV[4])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
if meta[1] ~= 'open' or now >= tonumber(meta[3]) then
  return {'ended'}
end
if meta[6] == '1' then
  return {'paused'}
end
if now < tonumber(meta[2]) then
  return {'not_started', string.format('%d', tonumber(meta[2]) - now)}
end
if not qty or qty < 1 or qty > tonumber(meta[4]) then
  return {'bad_quantity'}
end
local maxima = {}
for v in string.gmatch(meta[5] or '', '[^,]+') do
  maxima[#maxima + 1] = tonumber(v)
end
local nc = (#ARGV - 6) / 3
if nc < 1 or nc ~= math.floor(nc) then
  return redis.error_reply('hold: bad arguments')
end
for j = 1, nc do
  local a = 6 + 3 * (j - 1)
  local lim = tonumber(string.match(ARGV[a + 1], '^(%d+)/'))
  local inc = tonumber(ARGV[a + 2])
  if not lim or not maxima[lim + 1] or not inc or inc < 1 then
    return redis.error_reply('hold: charge ' .. j .. ' is of no limit of the sale')
  end
  local cur = tonumber(redis.call('HGET', KEYS[2 + j], ARGV[a + 1]) or '0')
  if cur + inc > maxima[lim + 1] then
    return {'limit_reached', tostring(cur), tostring(lim)}
  end
end
if redis.call('HSETNX', KEYS[2], ARGV[1], string.format('%d', now) .. '|' .. ARGV[3] .. '|' .. ARGV[4] .. '|' .. ARGV[5] .. '|' .. ARGV[6]) == 0 then
  return {'duplicate_id'}
end
for j = 1, nc do
  local a = 6 + 3 * (j - 1)
  local inc = tonumber(ARGV[a + 2])
  if redis.call('HINCRBY', KEYS[2 + j], ARGV[a + 1], inc) == inc and ARGV[a + 3] ~= '0' then
    redis.call('PEXPIREAT', KEYS[2 + j], ARGV[a + 3])
  end
end
return {'held'}
