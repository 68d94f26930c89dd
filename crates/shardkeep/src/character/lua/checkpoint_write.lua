-- Write a checkpoint unless a newer owner, or a newer schema of the game's document, already
-- wrote one.
-- KEYS[1] checkpoint hash; ARGV[1] writer's owner epoch, ARGV[2] snapshot JSON, ARGV[3] TTL ms,
-- ARGV[4] the snapshot's schema version
-- Reply: {'ok'} | {'not_owner', stored epoch} | {'schema_newer', stored schema}
-- A stored epoch or schema that is not a plain integer of at most 15 digits (what every writer
-- stores, and what the reader accepts) marks the hash corrupt: it is replaced like a key of
-- another type, never compared (Lua's tonumber would read 'inf', '1e300' or '0x10').
local function int(text)
  local digits = text and string.match(text, '^%-?(%d+)$')
  if digits and #digits <= 15 then
    return tonumber(text)
  end
  return nil
end
local kind = redis.call('TYPE', KEYS[1]).ok
local corrupt = kind ~= 'none' and kind ~= 'hash'
if kind == 'hash' then
  local stored = redis.call('HMGET', KEYS[1], 'epoch', 'schema')
  local epoch, schema = int(stored[1]), int(stored[2])
  if (stored[1] and not epoch) or (stored[2] and not schema) then
    corrupt = true
  else
    if epoch and epoch > tonumber(ARGV[1]) then
      return {'not_owner', stored[1]}
    end
    if (schema or 1) > tonumber(ARGV[4]) then
      return {'schema_newer', stored[2] or '1'}
    end
  end
end
if corrupt then
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'snapshot', ARGV[2], 'schema', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'ok'}
