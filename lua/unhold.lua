-- unhold: decide holds that hold.lua took on this bucket, each at most once.
-- KEYS: 1 holds (undecided), 2 held (kept: the order exists), then 2+i: the
--       counter hash of window i
-- ARGV: 1 mode, 2 n, 3..2+n order ids, then 2+n+i: the name of window i
-- mode 'keep': the admission on the home bucket took the order: its hold moves
--   from holds to held, its counts stay (they are the order's until its units
--   come back).
-- mode 'give': the order was refused, or its units came back (released,
--   failed, canceled): its counts go down and its entry goes, whether it was
--   undecided or kept. An id with no entry is given back already (or was never
--   held): nothing changes, so a give repeated after a crash gives once.
-- Returns one word per id: 'kept' | 'given' | 'none'.
local mode, n = ARGV[1], tonumber(ARGV[2])
local win = {}
for i = 3 + n, #ARGV do
  win[ARGV[i]] = KEYS[i - n]
end
local out = {}
for j = 1, n do
  local id = ARGV[2 + j]
  local v = redis.call('HGET', KEYS[1], id)
  out[j] = 'none'
  if mode == 'keep' then
    if v then
      redis.call('HDEL', KEYS[1], id)
      redis.call('HSET', KEYS[2], id, v)
      out[j] = 'kept'
    end
  else
    if not v then
      v = redis.call('HGET', KEYS[2], id)
    end
    if v then
      local charges = string.match(v, '^[^|]*|[^|]*|[^|]*|[^|]*|(.*)$') or ''
      local undo = {}
      for c in string.gmatch(charges, '[^,]+') do
        local lim, w, inc, subj = string.match(c, '^(%d+)/([^/]+)/(%d+)/(.+)$')
        if not w or not win[w] then
          return redis.error_reply('unhold: order ' .. id .. ' counts in window "' .. tostring(w) .. '", no key given')
        end
        undo[#undo + 1] = {win[w], lim .. '/' .. subj, tonumber(inc)}
      end
      for _, u in ipairs(undo) do
        if redis.call('HINCRBY', u[1], u[2], -u[3]) <= 0 then
          redis.call('HDEL', u[1], u[2])
        end
      end
      redis.call('HDEL', KEYS[1], id)
      redis.call('HDEL', KEYS[2], id)
      out[j] = 'given'
    end
  end
end
return out
