-- install: the last step of a rebuild on one hash tag. The keys the rebuild
-- wrote under staged names replace the live ones and the tag's epoch becomes
-- the rebuild's, in one step; unless something the rebuild read of the live
-- keys moved since (a gateway released an order it counted as pending, a
-- backend claimed one, a hold was decided), or another rebuild took over: then
-- nothing is written and the rebuild reads again.
-- KEYS: 1 epoch, 2..1+c the hashes the checks read, then pairs: staged, live
-- ARGV: 1 n (the rebuild's epoch), 2 c, 3 m, then m triples: index into KEYS
--       of a hash, field, expected value ('-' absent, 'v' .. value present;
--       '#' .. n: the hash holds n fields, whatever the field),
--       then one expiry per pair (unix ms, on this server's clock: PEXPIREAT; 0: none)
-- A live key whose staged one is absent is deleted (the rebuild found it empty).
-- Returns {'ok'} | {'fenced', epoch key's value} | {'changed', field}
local cur = redis.call('GET', KEYS[1])
if cur ~= 'r' .. ARGV[1] then
  return {'fenced', cur or ''}
end
local m = tonumber(ARGV[3])
for j = 0, m - 1 do
  local a = 4 + 3 * j
  local want = ARGV[a + 2]
  if string.sub(want, 1, 1) == '#' then
    if redis.call('HLEN', KEYS[tonumber(ARGV[a])]) ~= tonumber(string.sub(want, 2)) then
      return {'changed', KEYS[tonumber(ARGV[a])]}
    end
  else
    local v = redis.call('HGET', KEYS[tonumber(ARGV[a])], ARGV[a + 1])
    if (want == '-' and v) or (want ~= '-' and (not v or 'v' .. v ~= want)) then
      return {'changed', ARGV[a + 1]}
    end
  end
end
local t = 4 + 3 * m
local p = 0
for i = 2 + tonumber(ARGV[2]), #KEYS, 2 do
  local at = tonumber(ARGV[t + p])
  p = p + 1
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('RENAME', KEYS[i], KEYS[i + 1])
    if at > 0 then
      redis.call('PEXPIREAT', KEYS[i + 1], at)
    else
      redis.call('PERSIST', KEYS[i + 1])
    end
  else
    redis.call('DEL', KEYS[i + 1])
  end
end
redis.call('SET', KEYS[1], ARGV[1])
return {'ok'}
