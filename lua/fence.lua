-- fence: the first step of a rebuild of a sale's books (backend/rebuild.go) on
-- one hash tag. From this step on, admissions on the tag answer not_warmed
-- (its meta is gone) and every write-back from an older epoch is refused (the
-- epoch key names rebuild n as under way), until install.lua puts the rebuilt
-- keys in place.
-- KEYS: 1 meta, 2 epoch
-- ARGV: 1 n, the rebuild's epoch
-- Returns the epoch key's value before ('' when absent).
local prev = redis.call('GET', KEYS[2]) or ''
redis.call('SET', KEYS[2], 'r' .. ARGV[1])
redis.call('DEL', KEYS[1])
return prev
