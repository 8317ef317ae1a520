-- gcra: one request against a rate limit kept in Redis, shared by every
-- gateway (ratelimit.mode: global). GCRA: the key holds the "theoretical
-- arrival time" (TAT, µs on Redis's clock) of the next request; a key whose
-- TAT has passed is a full bucket, and expires then.
-- KEYS: 1 the limit's key (RateKey)
-- ARGV: 1 interval (µs between two requests at the steady rate),
--       2 tolerance (µs: interval × burst)
-- Returns {'allow'} | {'deny', wait_us}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval, tolerance = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat > now + tolerance then
  -- the rate was retuned down: owe one bucket of the new rate from now on
  tat = now + tolerance
end
local nxt = math.max(tat, now) + interval
if nxt - now > tolerance then
  return {'deny', tostring(nxt - now - tolerance)}
end
redis.call('SET', KEYS[1], string.format('%d', nxt), 'PX', math.ceil((nxt - now) / 1000) + 1)
return {'allow'}
