-- admit: decide one purchase atomically on the sale's shard.
-- KEYS: 1 meta, 2 stock (the region's, or the sale's), 3 users, 4 resv, 5 orders, 6 idem,
--       then 6+j: the counter hash of charge j's window (Keys.Limit)
--       (all under the sale's hash tag: keys.go).
-- ARGV: 1 user, 2 quantity, 3 order id, 4 the gateway's now (ms; no decision reads it),
--       5 idempotency key ('' = none), 6 region ('' = none), 7 payment deadline (ms, by
--       the gateway's clock: the record's is as far from the admission by this server's),
--       8 the order's charges as flashgate.EncodeCharges wrote them ('' or absent = none),
--       then for each charge j, 3 values: field ('<limit>/<subject>'), increment,
--       when the window's counter expires (Unix ms; 0: the whole sale, no expiry).
-- Time is this server's (TIME): the sale window is judged by it, counters
-- expire by it (PEXPIREAT), and it is the order's created time in its record
-- and reservation, so that every age of a reservation is judged on this one
-- clock (invariant 8). A gateway's clock decides nothing here.
-- Each limit's maximum is the sale's own, from meta ('lmax': the maxima in limit order,
-- written at warm; a meta warmed before 'lmax' existed has them in 'limits'), never
-- the caller's: a caller that could name a maximum could lift any limit. The charges
-- must be one per limit, in limit order, each of at least 1, or 0 for a charge held
-- already in another bucket (hold.lua: docs/buckets.md), which is neither checked nor
-- counted here (the record keeps its real increment, from ARGV[8]).
-- Returns {outcome, ...}:
--   {'ok', order_id, remaining, now}  reserved: stock deducted, user and every charge counted,
--                                 reservation recorded; now: this server's time (ms), the
--                                 order's created time
--   {'replay', order_id}          same user + idempotency key seen before: nothing changed
--   {'not_warmed'}                no meta or no stock key: unknown, never "sold out"
--   {'not_started', ms_left} | {'ended'} | {'bad_quantity'}
--   {'limit_reached', held, j}    j = 0: per_user_limit; j >= 1: charge j's limit (held: its count)
--   {'sold_out', remaining}
--   {'duplicate_id'}              the order id is taken: nothing changed (the caller's id source is broken)
--   {'paused'}                    the sale is paused (its meta's paused field is 1): nothing changed
local meta = redis.call('HMGET', KEYS[1], 'state', 'starts', 'ends', 'limit', 'omax', 'lmax', 'paused')
if not meta[1] then
  return {'not_warmed'}
end
local user, qty, id, idem = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[5]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local nowms = string.format('%d', now)
local idemField = user .. '|' .. idem
if idem ~= '' then
  local prev = redis.call('HGET', KEYS[6], idemField)
  if prev then
    return {'replay', prev}
  end
end
if meta[1] ~= 'open' then
  return {'ended'}
end
if meta[7] == '1' then
  return {'paused'}
end
local starts = tonumber(meta[2])
if now < starts then
  return {'not_started', string.format('%d', starts - now)}
end
if now >= tonumber(meta[3]) then
  return {'ended'}
end
if not qty or qty < 1 or qty > tonumber(meta[5]) then
  return {'bad_quantity'}
end
-- The buyer is counted first (HINCRBY: one command where reading the count and
-- raising it took two), and every later refusal takes the count back (refuse):
-- a refused purchase leaves Redis as it was, and the path that admits is the
-- short one.
local function refuse(reply)
  if redis.call('HINCRBY', KEYS[3], user, -qty) <= 0 then
    redis.call('HDEL', KEYS[3], user)
  end
  return reply
end
local held = redis.call('HINCRBY', KEYS[3], user, qty) - qty
if held + qty > tonumber(meta[4]) then
  local out = {'limit_reached', tostring(held), '0'}
  return refuse(out)
end
-- elsewhere: whether subject's limit counters live in another bucket of the sale
-- than this one (lua.LimitBucket: FNV-1a of the subject mod the number of
-- buckets; this bucket's index starts its tag suffix, after the '/' of
-- lua.BucketTag). Only such a charge may come with an increment of 0: it was
-- held in its own bucket (hold.lua). On a sale that is not split, none may.
local function elsewhere(subject)
  local tags = redis.call('HGET', KEYS[1], 'buckets') or ''
  local own = tonumber(string.match(KEYS[1], '/(%d+)[.}]'))
  if tags == '' or not own or not subject then
    return false
  end
  local k = select(2, string.gsub(tags, ',', ',')) + 1
  local h = 2166136261
  for i = 1, #subject do
    h = bit.bxor(h, string.byte(subject, i))
    if h < 0 then
      h = h + 4294967296
    end
    -- h * 16777619 mod 2^32, exactly in doubles: 16777619 = 2^24 + 403.
    h = (h * 403 + (h % 256) * 16777216) % 4294967296
  end
  return h % k ~= own
end
local charges = ARGV[8] or ''
local nc = 0
if #ARGV > 8 then
  nc = (#ARGV - 8) / 3
end
-- A sale without extra limits ('lmax' empty) and a purchase without charges: nothing to parse.
if nc > 0 or meta[6] ~= '' then
  local maxima = {}
  if meta[6] then
    for v in string.gmatch(meta[6], '[^,]+') do
      maxima[#maxima + 1] = tonumber(v)
    end
  else
    local ok, ls = pcall(cjson.decode, redis.call('HGET', KEYS[1], 'limits') or '')
    if ok and type(ls) == 'table' then
      for i, l in ipairs(ls) do
        maxima[i] = tonumber(l['max'])
      end
    end
  end
  if nc ~= #maxima then
    return refuse(redis.error_reply('admit: ' .. nc .. ' charges for ' .. #maxima .. ' limits'))
  end
  for j = 1, nc do
    local a = 8 + 3 * (j - 1)
    local inc = tonumber(ARGV[a + 2])
    if tonumber(string.match(ARGV[a + 1], '^(%d+)/')) ~= j - 1 or not inc or inc < 0 or not maxima[j] then
      return refuse(redis.error_reply('admit: charge ' .. j .. ' is not of limit ' .. (j - 1)))
    end
    local cur = 0
    if inc > 0 then
      cur = tonumber(redis.call('HGET', KEYS[6 + j], ARGV[a + 1]) or '0')
    elseif not elsewhere(string.match(ARGV[a + 1], '^%d+/(.+)$')) then
      return refuse(redis.error_reply('admit: charge ' .. j .. ' counts 0 and its counter is here'))
    end
    if cur + inc > maxima[j] then
      local out = {'limit_reached', tostring(cur), tostring(j)}
      return refuse(out)
    end
  end
end
local stock = redis.call('GET', KEYS[2])
if not stock then
  local out = {'not_warmed'}
  return refuse(out)
end
stock = tonumber(stock)
if stock < qty then
  local out = {'sold_out', tostring(stock)}
  return refuse(out)
end
-- An order id is used once. Ids are unique by construction (package orderid); if
-- two ever met, overwriting the first reservation would lose its unit: HSETNX
-- writes the order's record only when the id is free.
local expires = string.format('%d', now + (tonumber(ARGV[7]) - tonumber(ARGV[4])))
local rec = user .. '|' .. ARGV[2] .. '|' .. ARGV[6] .. '|' .. nowms .. '|' .. expires .. '|' .. idem .. '|' .. charges
if redis.call('HSETNX', KEYS[5], id, 'pending||' .. rec) == 0 then
  local out = {'duplicate_id'}
  return refuse(out)
end
local left = redis.call('DECRBY', KEYS[2], qty)
for j = 1, nc do
  local a = 8 + 3 * (j - 1)
  local inc = tonumber(ARGV[a + 2])
  -- A window's counter expires by itself, at its end by this server's clock;
  -- the expiry is set by the first count in it.
  if inc > 0 and redis.call('HINCRBY', KEYS[6 + j], ARGV[a + 1], inc) == inc and ARGV[a + 3] ~= '0' then
    redis.call('PEXPIREAT', KEYS[6 + j], ARGV[a + 3])
  end
end
redis.call('HSET', KEYS[4], id, rec)
if idem ~= '' then
  redis.call('HSET', KEYS[6], idemField, id)
end
return {'ok', id, tostring(left), nowms}
