-- Reserve in one round trip (C4, C5): the current record, or a fresh in-progress record when
-- there is none. The decision is idem-core's, in Rust: this script only reads, or writes the one
-- case that needs no decision (no record). Time is Redis's own (C11): every path needs it, a new
-- record for its deadline, an existing one for whether it is still live and how long its lease
-- runs. One key: runs unchanged on a Redis Cluster.
-- KEYS[1] the record. ARGV: 1 fingerprint, 2 new token, 3 lease ms, 4 grace ms, 5 the triple,
-- 6 the holder (the reserving process), 7 '1' for a store that reads first: the new record gets
-- its read header ('rh', see complete.lua), 8 the request's alternative fingerprint (C3; the
-- fingerprint again when it has none). new_record.lua writes the new record; its 'at' and
-- 'h' are for operators and take part in no decision.
-- Returns {packed, response}. Packed is 'inserted', now, deadline or 'existing', now, version,
-- fingerprint, token, state, deadline, triple, whether a response is stored (1 or 0), whether
-- it is in doubt (1 or 0: a mark 'dbt', its answer may still change), packed by cmsgpack into
-- one string: a client parses one value instead of ten, and Redis packs them in C for what
-- writing them as an array costs it (src/packed.rs). The response is false, or the stored one
-- only for the request's fingerprint or its alternative on a completed record (the cases it is
-- replayed, the alternative's from this one step: never a step under it), so an
-- answer transfers the same whatever the body's size; it stays out of the packing, which would
-- copy a large body again. Whether one is stored is said in every case: an in-progress record
-- with a response, or a completed one without, is corrupt (C12).
--
-- A fresh key is found absent by EXISTS, the cheapest read (an HMGET of eight fields costs Redis
-- three times as much, and most reservations are fresh keys). Any value there, ours or not, is
-- never overwritten: it is read once, its response with it (one HMGET), so a replay costs one
-- read more and the clock. A value that is not one of our hashes fails the read (WRONGTYPE):
-- an error, never a new record; a hash of someone else's has no version, and is corrupt.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('EXISTS', KEYS[1]) == 0 then
  local dl = write_new_record(now, ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
  return {cmsgpack.pack('inserted', now, dl), false}
end
local rec = redis.call('HMGET', KEYS[1], 'v', 'fp', 'tok', 'st', 'dl', 'id', 'resp', 'dbt')
local stored = 0
if rec[7] then
  stored = 1
end
local response = false
if (rec[2] == ARGV[1] or rec[2] == ARGV[8]) and rec[4] == '1' then
  response = rec[7]
end
local doubt = 0
if rec[8] then
  doubt = 1
end
return {cmsgpack.pack('existing', now, rec[1], rec[2], rec[3], rec[4], rec[5], rec[6], stored,
  doubt), response}
