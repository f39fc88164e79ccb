#!lua flags=no-writes
-- One record found by a scan, as a listing shows it: never its body, only the first 4 bytes of
-- the stored response (its version and status), so a listing transfers no bodies. Declared
-- no-writes, like lookup. Invoked once per key, pipelined, so it runs unchanged on a Cluster.
-- KEYS[1] the record. Returns false when it has gone since the scan (its TTL passed), or
-- {version, state, deadline, triple, reserved at or false, first 4 bytes of the response or false,
-- completed at or false, the first 300 bytes of the holder or false, the mark of doubt or false,
-- when it is next due or false}. A mark is about 1 KiB at most (Doubt::MAX_NOTE): its first 2048
-- bytes are enough to read one, and bound what a foreign value makes a listing transfer.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
local rec = redis.call('HMGET', KEYS[1], 'v', 'st', 'dl', 'id', 'at', 'resp', 'ca', 'h', 'dbt',
  'dca')
if rec[6] then
  rec[6] = string.sub(rec[6], 1, 4)
end
if rec[8] then
  rec[8] = string.sub(rec[8], 1, 300)
end
if rec[9] then
  rec[9] = string.sub(rec[9], 1, 2048)
end
return rec
