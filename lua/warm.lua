-- warm: make a sale known to Redis, once. Writes the stock keys, then meta (whose
-- presence means "warmed"), only if meta is absent, so a concurrent or repeated warm
-- never resets stock that admissions have already moved.
-- KEYS: 1 meta, 2.. stock keys
-- ARGV: 1 field count n, 2..(2n+1) meta field/value pairs, then one value per stock key
-- Returns 1 if it warmed, 0 if the sale was warm already.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local n = tonumber(ARGV[1])
for k = 2, #KEYS do
  redis.call('SET', KEYS[k], ARGV[2 * n + k])
end
local fields = {}
for j = 2, 2 * n + 1 do
  fields[#fields + 1] = ARGV[j]
end
redis.call('HSET', KEYS[1], unpack(fields))
return 1
