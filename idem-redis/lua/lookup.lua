#!lua flags=no-writes
-- The record as stored, for inspection. Declared no-writes, so it is served during a
-- CLIENT PAUSE WRITE (a failover) and on a replica.
-- KEYS[1] the record. Returns false, or {version, fingerprint, token, state, deadline, triple,
-- response or false}.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
return redis.call('HMGET', KEYS[1], 'v', 'fp', 'tok', 'st', 'dl', 'id', 'resp')
