-- give: the second half of a transfer (take.lua), run on the bucket that
-- receives the units: they join its stock once, however often it runs (the
-- gateway that took them and the backend's reconcile may both land it).
-- KEYS: 1 the receiver's stock key, 2 the receiver's transfers in (Keys.TransfersIn:
--       transfer id → the time it landed, ms), 3 the receiver's epoch (Keys.Epoch)
-- ARGV: 1 transfer id, 2 units, 3 the caller's now (ms; unused: the landing
--       is stamped with this server's TIME, the clock reconcile ages it by),
--       4 the epoch the take recorded
-- A take from before a rebuild never lands after it: the rebuild set the stock
-- of every bucket from MySQL, the taken units included.
-- Returns {'given', stock} | {'already'} | {'fenced'}
if (redis.call('GET', KEYS[3]) or '') ~= ARGV[4] then
  return {'fenced'}
end
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
if redis.call('HSETNX', KEYS[2], ARGV[1], now) == 0 then
  return {'already'}
end
return {'given', tostring(redis.call('INCRBY', KEYS[1], tonumber(ARGV[2])))}
