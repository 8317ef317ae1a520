-- confirm: the backend records what MySQL decided. The reservation ends (its units
-- are now counted by MySQL) and the order's status is written back for the gateway.
-- KEYS: 1 resv, 2 orders, 3 epoch
-- ARGV: 1 the epoch MySQL decided in ('0': unchecked), then triples of order id,
--       status, record ('reason|user|qty|region|created|expires|idem');
--       the record rewrites an order Redis lost.
-- Returns the number of reservations that ended, or -1 when a rebuild opened a
-- later epoch (it counted these decisions already): nothing is written then.
if ARGV[1] ~= '0' and (redis.call('GET', KEYS[3]) or '') ~= ARGV[1] then
  return -1
end
local ended = 0
for i = 2, #ARGV, 3 do
  local id = ARGV[i]
  ended = ended + redis.call('HDEL', KEYS[1], id)
  redis.call('HSET', KEYS[2], id, ARGV[i + 1] .. '|' .. ARGV[i + 2])
end
return ended
