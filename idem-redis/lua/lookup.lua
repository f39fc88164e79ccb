#!lua flags=no-writes
-- The record as stored. Declared no-writes, so it is served during a CLIENT PAUSE WRITE (a
-- failover) and on a replica.
-- KEYS[1] the record; ARGV[1] '1' to read what operators read beside it (inspect), absent for
-- the protocol's own reads. Returns false, or {version, fingerprint, token, state, deadline,
-- triple, whether a response is stored (1 or 0), response or false}, and with ARGV[1] '1' also
-- {reserved at, completed at, the first 300 bytes of the holder} (each false when the record
-- does not have it: written before it was kept).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
local rec = redis.call('HMGET', KEYS[1], 'v', 'fp', 'tok', 'st', 'dl', 'id')
rec[7] = redis.call('HEXISTS', KEYS[1], 'resp')
rec[8] = redis.call('HGET', KEYS[1], 'resp')
if ARGV[1] == '1' then
  local more = redis.call('HMGET', KEYS[1], 'at', 'ca', 'h')
  rec[9] = more[1]
  rec[10] = more[2]
  if more[3] then
    rec[11] = string.sub(more[3], 1, 300)
  else
    rec[11] = false
  end
end
return rec
