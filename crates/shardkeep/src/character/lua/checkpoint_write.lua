-- Write a checkpoint unless a newer owner already wrote one.
-- KEYS[1] checkpoint hash; ARGV[1] writer's owner epoch, ARGV[2] snapshot JSON, ARGV[3] TTL ms
-- Reply: {'ok'} | {'not_owner', stored epoch}
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'hash' then
  local stored = tonumber(redis.call('HGET', KEYS[1], 'epoch'))
  if stored and stored > tonumber(ARGV[1]) then
    return {'not_owner', tostring(stored)}
  end
elseif kind ~= 'none' then
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'snapshot', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'ok'}
