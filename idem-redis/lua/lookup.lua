#!lua flags=no-writes
-- The record as stored, for inspection. Declared no-writes, so it is served during a
-- CLIENT PAUSE WRITE (a failover) and on a replica.
-- KEYS[1] the record. Returns false, or {version, fingerprint, token, state, deadline, triple,
-- whether a response is stored (1 or 0), response or false}.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
local rec = redis.call('HMGET', KEYS[1], 'v', 'fp', 'tok', 'st', 'dl', 'id')
rec[7] = redis.call('HEXISTS', KEYS[1], 'resp')
rec[8] = redis.call('HGET', KEYS[1], 'resp')
return rec
