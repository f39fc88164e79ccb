-- Written before reserve.lua and replace.lua (src/scripts.rs): a new in-progress record of
-- KEYS[1], in one HSET, and its expiry, the deadline plus the grace. It is not in doubt (no
-- 'dbt', 'dca': store rule 6) and carries when it was reserved ('at', Redis's now) and its
-- holder ('h'), for operators; a store that reads first ('1') gives it its read header ('rh',
-- see complete.lua). Returns the deadline (Redis milliseconds).
local function write_new_record(now, fp, tok, lease, grace, id, holder, reads_first)
  local dl = now + tonumber(lease)
  local dls = string.format('%d', dl)
  local fields = {'v', '1', 'fp', fp, 'tok', tok, 'st', '0', 'dl', dls, 'id', id,
    'at', string.format('%d', now), 'h', holder}
  if reads_first == '1' then
    fields[#fields + 1] = 'rh'
    fields[#fields + 1] = cmsgpack.pack('1', fp, tok, '0', dls, id)
  end
  redis.call('HSET', KEYS[1], unpack(fields))
  redis.call('PEXPIREAT', KEYS[1], dl + tonumber(grace))
  return dl
end
