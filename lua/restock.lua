-- restock: give back to Redis the units of orders MySQL has just canceled (by the
-- buyer, or for want of payment), exactly once per order however often it runs.
-- KEYS: 1 users, 2 resv, 3 orders, 4 restocked (set of the order ids this script
--       settled), 5 give-backs (Keys.giveBack), 6 epoch, 7.. the stock keys the orders'
--       regions use, then the counter hashes of the windows the orders' charges count in
-- ARGV: 1 n (orders), then n quintuples of order id, index into KEYS of its stock key
--       (>= 7), status, reason, record ('user|qty|region|created|expires|idem|charges',
--       as MySQL has it), then the fields ('<limit>/<subject>', comma-separated)
--       counted in another bucket ('' = none), then pairs of window name, index into
--       KEYS of its counter hash, then the epoch MySQL canceled them in ('0': unchecked)
-- A charge counted in another bucket (docs/buckets.md) is not undone here: it goes into
-- the give-backs hash under the order id, in the same step, for lua.giveBack.
-- Returns one word per order:
--   'restocked'  its units went back now: stock up, the buyer's counter down (not for
--                a buyer's cancel: see below), the reservation (if any) gone
--   'already'    they went back before: this script ran for the order, or the order
--                failed and release.lua gave them back
--   'unknown'    Redis had no record of the order (it lost its data): its counters
--                were rebuilt from MySQL, which no longer counts the order, so they
--                are left alone
--   'fenced'     (one word for all of them) called from an older epoch: see below
-- In every case the order's record ends as status|reason|record, and the order
-- joins the restocked set. Called from an older epoch than the tag's (a rebuild
-- counted the cancels already, restocked set included), it answers {'fenced'}
-- and writes nothing.
--
-- A buyer's cancel gives the units back to sale, not the buyer's quota: the counter
-- in users stays as it was until the sale is over, as MySQL's user_purchases does
-- (mysql.ReturnUnits), so that one account cannot buy, cancel and buy again, handing
-- unit after unit to a waiting account. An expiry (the buyer never paid) gives both.
--
-- Whether the units went back is the restocked set's word, not the record's: the
-- backend's confirm.lua rewrites records from MySQL (a redelivery of a canceled
-- order writes 'canceled' before this script ran; a stale one writes 'confirmed'
-- after it did), so a status can lie in both directions.
local n = tonumber(ARGV[1])
if ARGV[#ARGV] ~= '0' and (redis.call('GET', KEYS[6]) or '') ~= ARGV[#ARGV] then
  return {'fenced'}
end
local win = {}
for i = 3 + 5 * n, #ARGV - 1, 2 do
  win[ARGV[i]] = KEYS[tonumber(ARGV[i + 1])]
end
local remote = {}
for f in string.gmatch(ARGV[2 + 5 * n] or '', '[^,]+') do
  remote[f] = true
end
local words, users, qtys, undos, aways = {}, {}, {}, {}, {}
-- Decide everything first: an error must not leave half the orders written.
for j = 1, n do
  local i = 5 * (j - 1) + 2
  local id = ARGV[i]
  local ord = redis.call('HGET', KEYS[3], id)
  if redis.call('SISMEMBER', KEYS[4], id) == 1 then
    words[j] = 'already'
  elseif not ord then
    words[j] = 'unknown'
  else
    local st, user, qty, region = string.match(ord, '^([^|]*)|[^|]*|([^|]*)|([^|]*)|([^|]*)|')
    if st == 'failed' or st == 'released' then
      words[j] = 'already'
    else
      local want = string.match(ARGV[i + 4], '^[^|]*|[^|]*|([^|]*)|')
      if region ~= want then
        return redis.error_reply('restock: order ' .. id .. ' is in region "' .. tostring(region) ..
          '" in Redis, "' .. tostring(want) .. '" in MySQL')
      end
      -- The charges Redis counted at admission are the ones to undo.
      local charges = string.match(ord, '^[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|([^|]*)$') or ''
      local undo, away = {}, {}
      for c in string.gmatch(charges, '[^,]+') do
        local lim, w, inc, subj = string.match(c, '^(%d+)/([^/]+)/(%d+)/(.+)$')
        if lim and remote[lim .. '/' .. subj] then
          away[#away + 1] = c
        elseif not win[w] then
          return redis.error_reply('restock: order ' .. id .. ' counts in window "' .. tostring(w) .. '", no key given')
        else
          undo[#undo + 1] = {win[w], lim .. '/' .. subj, tonumber(inc)}
        end
      end
      words[j], users[j], qtys[j], undos[j], aways[j] = 'restocked', user, tonumber(qty), undo, away
    end
  end
end
for j = 1, n do
  local i = 5 * (j - 1) + 2
  local id = ARGV[i]
  if words[j] == 'restocked' then
    redis.call('INCRBY', KEYS[tonumber(ARGV[i + 1])], qtys[j])
    if ARGV[i + 3] ~= 'canceled' and redis.call('HINCRBY', KEYS[1], users[j], -qtys[j]) <= 0 then
      redis.call('HDEL', KEYS[1], users[j])
    end
    for _, u in ipairs(undos[j]) do
      if redis.call('HINCRBY', u[1], u[2], -u[3]) <= 0 then
        redis.call('HDEL', u[1], u[2])
      end
    end
    if #aways[j] > 0 then
      redis.call('HSET', KEYS[5], id, table.concat(aways[j], ','))
    end
  end
  redis.call('HDEL', KEYS[2], id)
  redis.call('HSET', KEYS[3], id, ARGV[i + 2] .. '|' .. ARGV[i + 3] .. '|' .. ARGV[i + 4])
  redis.call('SADD', KEYS[4], id)
end
return words
