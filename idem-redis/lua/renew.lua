-- Fenced heartbeat (C9): the lease runs again from Redis's now; when it was reserved ('at')
-- stays, and a read header ('rh', see complete.lua) gets the new deadline.
-- KEYS[1] the record. ARGV: 1 token, 2 lease ms, 3 grace ms.
-- Returns the new deadline, or false when the lease is lost.
local rec = redis.call('HMGET', KEYS[1], 'tok', 'st', 'rh', 'v', 'fp', 'id')
if rec[1] ~= ARGV[1] or rec[2] ~= '0' then
  return false
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dl = now + tonumber(ARGV[2])
local dls = string.format('%d', dl)
if rec[3] then
  redis.call('HSET', KEYS[1], 'dl', dls, 'rh', cmsgpack.pack(rec[4], rec[5], ARGV[1], '0', dls,
    rec[6]))
else
  redis.call('HSET', KEYS[1], 'dl', dls)
end
redis.call('PEXPIREAT', KEYS[1], dl + tonumber(ARGV[3]))
return dl
