-- Write checkpoints, each unless a newer owner, or a newer schema of the game's document, already
-- wrote one (after the integer helpers of lua/ints.lua). One call carries any number of
-- checkpoints (all in one cluster slot): the call's own cost is paid once for all of them.
-- KEYS[i] checkpoint hash i; ARGV[1] TTL ms; then per key i: ARGV[3i-1] the writer's owner
-- epoch, ARGV[3i] snapshot JSON, ARGV[3i+1] the snapshot's schema version
-- Reply: per key, in order, {'ok'} | {'not_owner', stored epoch} | {'schema_newer', stored schema}
-- A readable stored epoch above the writer's always refuses. A stored epoch that is not a
-- canonical integer marks the hash corrupt: it is replaced like a key of another type (the
-- reader refuses it too, so it holds nothing a login could use). A corrupt schema beside an
-- epoch the writer is entitled to is replaced the same way.
local function write_one(key, writer_epoch, body, writer_schema, ttl)
  -- One read tells the three cases apart: an error is a key of another type (corrupt), two
  -- missing fields a key with nothing to compare (absent, or a hash holding neither), anything
  -- else a hash whose fence and schema are checked.
  local stored = redis.pcall('HMGET', key, 'epoch', 'schema')
  local corrupt = stored.err ~= nil
  if not corrupt and (stored[1] or stored[2]) then
    local epoch = canon_int(stored[1])
    if stored[1] and not epoch then
      corrupt = true
    elseif epoch and cmp_int(epoch, writer_epoch) > 0 then
      return {'not_owner', epoch}
    else
      local schema = canon_int(stored[2])
      if stored[2] and not schema then
        corrupt = true
      elseif cmp_int(schema or '1', writer_schema) > 0 then
        return {'schema_newer', schema or '1'}
      end
    end
  end
  if corrupt then
    redis.call('DEL', key)
  end
  redis.call('HSET', key, 'epoch', writer_epoch, 'snapshot', body, 'schema', writer_schema)
  redis.call('PEXPIRE', key, ttl)
  return {'ok'}
end

local replies = {}
for i = 1, #KEYS do
  replies[i] = write_one(KEYS[i], ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1], ARGV[1])
end
return replies
