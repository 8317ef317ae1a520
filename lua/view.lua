-- view: one bucket's stock and transfer ledger, read in one step, so that a
-- reader adding up the buckets (lua.Remaining) counts every unit on the move
-- at least once (docs/buckets.md).
-- KEYS: 1 the bucket's transfers out, 2 its transfers in, 3.. its stock keys
-- Returns {{stock per key ('' when absent)}, {transfers out: id, entry, ...}, {ids of transfers in}}
local stock = {}
for i = 3, #KEYS do
  stock[#stock + 1] = redis.call('GET', KEYS[i]) or ''
end
return {stock, redis.call('HGETALL', KEYS[1]), redis.call('HKEYS', KEYS[2])}
