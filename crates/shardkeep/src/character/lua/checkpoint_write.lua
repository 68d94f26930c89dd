-- Write a checkpoint unless a newer owner, or a newer schema of the game's document, already
-- wrote one.
-- KEYS[1] checkpoint hash; ARGV[1] writer's owner epoch, ARGV[2] snapshot JSON, ARGV[3] TTL ms,
-- ARGV[4] the snapshot's schema version
-- Reply: {'ok'} | {'not_owner', stored epoch} | {'schema_newer', stored schema}
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'hash' then
  local stored = redis.call('HMGET', KEYS[1], 'epoch', 'schema')
  local epoch = tonumber(stored[1])
  if epoch and epoch > tonumber(ARGV[1]) then
    return {'not_owner', tostring(epoch)}
  end
  local schema = tonumber(stored[2]) or 1
  if schema > tonumber(ARGV[4]) then
    return {'schema_newer', tostring(schema)}
  end
elseif kind ~= 'none' then
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'snapshot', ARGV[2], 'schema', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'ok'}
