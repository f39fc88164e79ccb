-- A decision about a record in doubt (store rule 7; docs/state-machine.md, "Records in doubt"):
-- one fenced compare-and-set and its audit entry, in one script. The record must exist, be
-- completed ('st' 1), carry the decider's token, be live by Redis's clock (its deadline after
-- now) and carry exactly the mark of doubt the decider read ('dbt'). Then the change:
--   settle  ('s'): the real answer in place of the one in doubt, retained from now (its TTL),
--                  never shorter than the record had left; no mark; when it was reserved and
--                  completed stay;
--   release ('r'): the record deleted, the key new again (C8);
--   defer   ('d'): the new mark, due for a check again at now + the delay ('dca').
-- and the entry is appended to the record's audit trail, a list in the record's hash slot
-- (KEYS[2]): each element is '<now ms>:<kept until ms>:' and the entry's bytes; the list keeps
-- its newest elements (ARGV[8]: ListQuery::MAX_LIMIT) and lives until its last entry is to go (an
-- element past its own 'kept until' may stay that long: the reader skips it).
-- Nothing is written unless everything can be: a value under either key that is not ours fails
-- the script (WRONGTYPE) before any write.
-- KEYS[1] the record, KEYS[2] its audit trail. ARGV: 1 token, 2 the mark as read, 3 the change
-- ('s', 'r' or 'd'), 4 the encoded response (settle) or the new mark (defer), 5 the retention
-- (settle) or the delay (defer) in ms, 6 the audit entry, 7 how long the entry is kept, ms,
-- 8 how many elements the trail keeps.
-- Returns 1 when applied, 0 when the record is not as read (nothing written).
local rec = redis.call('HMGET', KEYS[1], 'tok', 'st', 'dl', 'dbt')
local trail = redis.call('TYPE', KEYS[2])['ok']
if trail ~= 'none' and trail ~= 'list' then
  return redis.error_reply('WRONGTYPE the audit trail ' .. KEYS[2] .. ' is a ' .. trail)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dl = rec[3] and tonumber(rec[3])
if rec[1] ~= ARGV[1] or rec[2] ~= '1' or not dl or dl <= now or not rec[4]
    or rec[4] ~= ARGV[2] then
  return 0
end
local change = ARGV[3]
if change == 's' then
  -- Never sooner than the record's deadline: a settled key never turns new before it would.
  local until_ = math.max(dl, now + tonumber(ARGV[5]))
  redis.call('HSET', KEYS[1], 'resp', ARGV[4], 'dl', string.format('%d', until_))
  redis.call('HDEL', KEYS[1], 'dbt', 'dca')
  redis.call('PEXPIREAT', KEYS[1], until_)
elseif change == 'r' then
  redis.call('DEL', KEYS[1])
elseif change == 'd' then
  redis.call('HSET', KEYS[1], 'dbt', ARGV[4],
    'dca', string.format('%d', now + tonumber(ARGV[5])))
else
  return redis.error_reply('ERR unknown change ' .. change)
end
local kept = now + tonumber(ARGV[7])
redis.call('RPUSH', KEYS[2], string.format('%d:%d:', now, kept) .. ARGV[6])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[8]), -1)
-- The list lives as long as its longest-kept entry: never shortened by an entry kept less long.
local ttl = redis.call('PTTL', KEYS[2])
if ttl == -1 or now + ttl < kept then
  redis.call('PEXPIREAT', KEYS[2], kept)
end
return 1
