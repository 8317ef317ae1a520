-- reconcile: set a sale's stock keys to what MySQL says is left, with the
-- reservations counted here, in the same atomic step that reads them.
-- KEYS: 1 resv, 2.. one stock key per region (all under the sale's hash tag)
-- ARGV: 1 mode ('all': set every stock key | 'missing': set only absent ones),
--       then for each stock key, 4 values: region ('' for a sale without regions),
--       avail (MySQL total - sold), extra (units to take off besides the
--       reservations: orders in flight Redis holds no reservation of, minus
--       reserved orders MySQL has already counted), expected reserved units
--       ('' = do not check).
-- The caller read the reservations before; if the units reserved in a region
-- it sets differ from what it expected, something moved meanwhile and nothing
-- is written.
-- Returns {'changed', region, expected, actual} or
--         {'ok', before_1, after_1, ...}: before '' for a key that was absent,
--         after '' for a key left alone.
local mode = ARGV[1]
local n = #KEYS - 1
local at = {}
local reserved = {}
for i = 1, n do
  at[ARGV[2 + (i - 1) * 4]] = i
  reserved[i] = 0
end
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do
  local qty, region = string.match(v, '^[^|]*|([^|]*)|([^|]*)|')
  local i = at[region]
  if i then
    reserved[i] = reserved[i] + tonumber(qty)
  end
end
local befores = {}
for i = 1, n do
  befores[i] = redis.call('GET', KEYS[i + 1])
  local expected = ARGV[5 + (i - 1) * 4]
  local set = mode == 'all' or not befores[i]
  if set and expected ~= '' and tonumber(expected) ~= reserved[i] then
    return {'changed', ARGV[2 + (i - 1) * 4], expected, string.format('%d', reserved[i])}
  end
end
local out = {'ok'}
for i = 1, n do
  local before = befores[i]
  if mode == 'all' or not before then
    local b = 2 + (i - 1) * 4
    local value = string.format('%d', tonumber(ARGV[b + 1]) - tonumber(ARGV[b + 2]) - reserved[i])
    redis.call('SET', KEYS[i + 1], value)
    out[#out + 1] = before or ''
    out[#out + 1] = value
  else
    out[#out + 1] = before
    out[#out + 1] = ''
  end
end
return out
