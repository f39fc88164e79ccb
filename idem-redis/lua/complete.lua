-- Fenced completion (C6): only the token holder of an in-progress record. Not atomic with the
-- effect (C14): Redis is another system than the one the effect wrote to.
-- The completed record's TTL is its retention: when it passes, the key is new again (C10).
-- When it was reserved ('at') and its holder ('h') stay: a completion is not a new reservation.
-- When it landed is kept ('ca', Redis's now), for operators.
-- An answer whose outcome is unknown is marked in doubt (store rule 6): its mark ('dbt', as
-- Doubt::encode writes it) and when it is next due for a check ('dca', Redis's now: at once);
-- any other answer clears both.
-- A store that reads first (ARGV[5] '1') keeps a read header ('rh') on the records it writes:
-- the record's version, fingerprint, token, state, deadline and triple, as stored, packed by
-- cmsgpack into one string, so that its read is one HMGET of the header, the response and the
-- version (src/record.rs, `read_header`). The reservation, takeover and renewal scripts write
-- it in progress, this one completed; an answer in doubt has none, nor does a completion by a
-- store that does not read first. Nothing else changes a record but deleting it. During a
-- rolling upgrade, a completion by a release that does not know headers leaves one in
-- progress beside a response, which the read sets aside for the record's fields. A renewal by
-- such a release (of a lease a newer process handed it) leaves the header's deadline: an
-- earlier one sends the engine to a takeover whose compare-and-set reads the real one and
-- fails; a later one delays a takeover, answering in flight (422 to another body) until then.
-- KEYS[1] the record. ARGV: 1 token, 2 encoded response, 3 retention ms, 4 the mark of doubt
-- (empty or absent: none), 5 '1' for a store that reads first.
-- A field is deleted only where there is one (an in-progress record has no mark of doubt unless
-- damaged by hand): an HDEL of absent fields costs Redis as much as one of present ones.
-- Returns 1, or 0 when the lease is lost.
local rec = redis.call('HMGET', KEYS[1], 'tok', 'st', 'v', 'fp', 'id', 'dbt', 'dca', 'rh')
if rec[1] ~= ARGV[1] or rec[2] ~= '0' then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dl = string.format('%d', now + tonumber(ARGV[3]))
local ca = string.format('%d', now)
if ARGV[4] and ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'st', '1', 'resp', ARGV[2], 'dl', dl, 'ca', ca, 'dbt', ARGV[4],
    'dca', ca)
  if rec[8] then
    redis.call('HDEL', KEYS[1], 'rh')
  end
elseif ARGV[5] == '1' then
  redis.call('HSET', KEYS[1], 'st', '1', 'resp', ARGV[2], 'dl', dl, 'ca', ca,
    'rh', cmsgpack.pack(rec[3], rec[4], rec[1], '1', dl, rec[5]))
  if rec[6] or rec[7] then
    redis.call('HDEL', KEYS[1], 'dbt', 'dca')
  end
else
  redis.call('HSET', KEYS[1], 'st', '1', 'resp', ARGV[2], 'dl', dl, 'ca', ca)
  if rec[6] or rec[7] or rec[8] then
    redis.call('HDEL', KEYS[1], 'dbt', 'dca', 'rh')
  end
end
redis.call('PEXPIREAT', KEYS[1], dl)
return 1
