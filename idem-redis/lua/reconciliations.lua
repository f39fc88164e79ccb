#!lua flags=no-writes
-- The audit trail of one record, as stored, with Redis's clock to tell which entries are still
-- kept (each element carries its own 'kept until': see resolve.lua). Declared no-writes, like
-- lookup. KEYS[1] the audit trail. Returns {now, {element, ...}}, oldest first (at most the
-- newest 1000: the list keeps no more). A value that is not a list fails the read (WRONGTYPE).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {now, redis.call('LRANGE', KEYS[1], 0, -1)}
