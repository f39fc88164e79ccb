-- Fenced completion (C6): only the token holder of an in-progress record. Not atomic with the
-- effect (C14): Redis is another system than the one the effect wrote to.
-- The completed record's TTL is its retention: when it passes, the key is new again (C10).
-- When it was reserved ('at') and its holder ('h') stay: a completion is not a new reservation.
-- When it landed is kept ('ca', Redis's now), for operators.
-- An answer whose outcome is unknown is marked in doubt (store rule 6): its mark ('dbt', as
-- Doubt::encode writes it) and when it is next due for a check ('dca', Redis's now: at once);
-- any other answer clears both.
-- KEYS[1] the record. ARGV: 1 token, 2 encoded response, 3 retention ms, 4 the mark of doubt
-- (empty or absent: none).
-- Returns 1, or 0 when the lease is lost.
local rec = redis.call('HMGET', KEYS[1], 'tok', 'st')
if rec[1] ~= ARGV[1] or rec[2] ~= '0' then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dl = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'st', '1', 'resp', ARGV[2], 'dl', string.format('%d', dl),
  'ca', string.format('%d', now))
if ARGV[4] and ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'dbt', ARGV[4], 'dca', string.format('%d', now))
else
  redis.call('HDEL', KEYS[1], 'dbt', 'dca')
end
redis.call('PEXPIREAT', KEYS[1], dl)
return 1
