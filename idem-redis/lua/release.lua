-- Fenced release (C8): the holder gives the key back because nothing happened.
-- KEYS[1] the record. ARGV: 1 token. Returns 1, or 0 when the lease is lost.
local rec = redis.call('HMGET', KEYS[1], 'tok', 'st')
if rec[1] ~= ARGV[1] or rec[2] ~= '0' then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
