-- take: the first half of a transfer of units between two buckets of a sale
-- (docs/buckets.md), run on the bucket that gives them. The units leave its
-- stock and are written into its ledger of transfers out in the same step, so a
-- crash after it loses nothing: whoever finds the entry (the gateway that
-- started the transfer, or the backend's reconcile) lands it with give.lua.
-- KEYS: 1 the giver's stock key (the region's, or the sale's), 2 the giver's
--       transfers out (Keys.TransfersOut), 3 the giver's epoch (Keys.Epoch)
-- ARGV: 1 transfer id, 2 units wanted, 3 receiver's bucket index, 4 region
--       ('' = none), 5 the caller's now (ms; unused: the entry is stamped with
--       this server's TIME, the clock reconcile ages it by)
-- It takes what it has, up to the units wanted. The entry records the giver's
-- epoch: give.lua lands the units only in the same epoch (a rebuild in between
-- set every bucket's stock from MySQL, these units included).
-- Returns {'took', units, left, epoch} | {'empty'}
local have = tonumber(redis.call('GET', KEYS[1]) or '0')
if have <= 0 then
  return {'empty'}
end
local n = math.min(have, tonumber(ARGV[2]))
local left = redis.call('DECRBY', KEYS[1], n)
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local epoch = redis.call('GET', KEYS[3]) or ''
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3] .. '|' .. ARGV[4] .. '|' .. n .. '|' .. now .. '|' .. epoch)
return {'took', tostring(n), tostring(left), epoch}
