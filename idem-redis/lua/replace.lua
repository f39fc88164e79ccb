-- Takeover of an orphan (C9) or start over after retention (C10): compare-and-set on the record
-- the decision saw: it still carries the previous token, is in the state the decision saw and
-- is expired by Redis's clock. A late completion or a renewal changes the state or the
-- deadline, so it is never overwritten. A takeover is a new reservation: 'at' is Redis's now, the
-- holder ('h') is the taker, and no completion time ('ca') is kept. Nor is a mark of doubt
-- ('dbt', 'dca'): the new execution is not in doubt (store rule 6); the DEL clears them.
-- KEYS[1] the record. ARGV: 1 previous token, 2 previous state ('0' or '1'), 3 fingerprint,
-- 4 new token, 5 lease ms, 6 grace ms, 7 the triple, 8 the holder, 9 '1' for a store that reads
-- first: the new record gets its read header ('rh', see complete.lua).
-- Returns the new deadline, or false when the record changed.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rec = redis.call('HMGET', KEYS[1], 'tok', 'st', 'dl')
if rec[1] ~= ARGV[1] or rec[2] ~= ARGV[2] or not rec[3] or tonumber(rec[3]) > now then
  return false
end
local dl = now + tonumber(ARGV[5])
local dls = string.format('%d', dl)
local fields = {'v', '1', 'fp', ARGV[3], 'tok', ARGV[4], 'st', '0', 'dl', dls, 'id', ARGV[7],
  'at', string.format('%d', now), 'h', ARGV[8]}
if ARGV[9] == '1' then
  fields[#fields + 1] = 'rh'
  fields[#fields + 1] = cmsgpack.pack('1', ARGV[3], ARGV[4], '0', dls, ARGV[7])
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('PEXPIREAT', KEYS[1], dl + tonumber(ARGV[6]))
return dl
