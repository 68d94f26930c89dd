-- Write a placement record unless a newer owner already wrote one.
-- KEYS[1] placement hash; ARGV[1] writer's owner epoch, ARGV[2] record JSON, ARGV[3] TTL ms
-- Reply: {'ok'} | {'stale', stored epoch}
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'hash' then
  local stored = tonumber(redis.call('HGET', KEYS[1], 'epoch'))
  if stored and stored > tonumber(ARGV[1]) then
    return {'stale', tostring(stored)}
  end
elseif kind ~= 'none' then
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'record', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'ok'}
