-- Write a checkpoint unless a newer owner, or a newer schema of the game's document, already
-- wrote one (after the integer helpers of lua/ints.lua).
-- KEYS[1] checkpoint hash; ARGV[1] writer's owner epoch, ARGV[2] snapshot JSON, ARGV[3] TTL ms,
-- ARGV[4] the snapshot's schema version
-- Reply: {'ok'} | {'not_owner', stored epoch} | {'schema_newer', stored schema}
-- A readable stored epoch above the writer's always refuses. A stored epoch that is not a
-- canonical integer marks the hash corrupt: it is replaced like a key of another type (the
-- reader refuses it too, so it holds nothing a login could use). A corrupt schema beside an
-- epoch the writer is entitled to is replaced the same way.
local kind = redis.call('TYPE', KEYS[1]).ok
local corrupt = kind ~= 'none' and kind ~= 'hash'
if kind == 'hash' then
  local stored = redis.call('HMGET', KEYS[1], 'epoch', 'schema')
  local epoch = canon_int(stored[1])
  if stored[1] and not epoch then
    corrupt = true
  elseif epoch and cmp_int(epoch, ARGV[1]) > 0 then
    return {'not_owner', epoch}
  else
    local schema = canon_int(stored[2])
    if stored[2] and not schema then
      corrupt = true
    elseif cmp_int(schema or '1', ARGV[4]) > 0 then
      return {'schema_newer', schema or '1'}
    end
  end
end
if corrupt then
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'snapshot', ARGV[2], 'schema', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'ok'}
