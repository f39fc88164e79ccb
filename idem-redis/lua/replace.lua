-- Takeover of an orphan (C9) or start over after retention (C10): compare-and-set on the record
-- the decision saw: it still carries the previous token, is in the state the decision saw and
-- is expired by Redis's clock. A late completion or a renewal changes the state or the
-- deadline, so it is never overwritten. A takeover is a new reservation: 'at' is Redis's now, the
-- holder ('h') is the taker, and no completion time ('ca') is kept. Nor is a mark of doubt
-- ('dbt', 'dca'): the new execution is not in doubt (store rule 6); the DEL clears them.
-- KEYS[1] the record. ARGV: 1 previous token, 2 previous state ('0' or '1'), 3 fingerprint,
-- 4 new token, 5 lease ms, 6 grace ms, 7 the triple, 8 the holder, 9 '1' for a store that reads
-- first: the new record gets its read header ('rh', see complete.lua).
-- Returns the new deadline, or false when the record changed, or its deadline is not the
-- digits a script writes (edited by hand): nothing written, and the reservation's next step
-- reads the record as it is (corrupt, C12).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rec = redis.call('HMGET', KEYS[1], 'tok', 'st', 'dl')
local dl = rec[3] and string.match(rec[3], '^%d+$') and tonumber(rec[3])
if rec[1] ~= ARGV[1] or rec[2] ~= ARGV[2] or not dl or dl > now then
  return false
end
redis.call('DEL', KEYS[1])
return write_new_record(now, ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9])
