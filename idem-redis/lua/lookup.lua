#!lua flags=no-writes
-- The record as stored, read once (one HMGET). Declared no-writes, so it is served during a
-- CLIENT PAUSE WRITE (a failover) and on a replica.
-- KEYS[1] the record; ARGV[1] '1' to read what operators read beside it (inspect), absent for
-- the protocol's own reads (which do not even fetch it). Returns false, or {version,
-- fingerprint, token, state, deadline, triple, whether a response is stored (1 or 0), response
-- or false}, and with ARGV[1] '1' also {reserved at, completed at, the first 300 bytes of the
-- holder, the mark of doubt, when it is next due} (each false when the record does not have it:
-- written before it was kept, or not in doubt). A value that is not one of our hashes fails the
-- read (WRONGTYPE).
local rec
if ARGV[1] == '1' then
  rec = redis.call('HMGET', KEYS[1], 'v', 'fp', 'tok', 'st', 'dl', 'id', 'resp', 'at', 'ca', 'h',
    'dbt', 'dca')
else
  rec = redis.call('HMGET', KEYS[1], 'v', 'fp', 'tok', 'st', 'dl', 'id', 'resp')
end
-- No version: no record, or a hash of someone else's (which the caller finds corrupt).
if not rec[1] and redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
local response = rec[7]
local out = {rec[1], rec[2], rec[3], rec[4], rec[5], rec[6], 0, response}
if response then
  out[7] = 1
end
if ARGV[1] == '1' then
  out[9] = rec[8]
  out[10] = rec[9]
  out[11] = rec[10] and string.sub(rec[10], 1, 300)
  out[12] = rec[11]
  out[13] = rec[12]
end
return out
