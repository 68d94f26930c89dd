-- Move a handoff between scopes, keeping its remaining TTL.
-- KEYS[1] consumed marker, KEYS[2] source key, KEYS[3] destination key
-- Reply: {'consumed'} | {'missing'} | {'moved', remaining TTL in ms}
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {'consumed'}
end
local ttl = redis.call('PTTL', KEYS[2])
if ttl == -2 then
  return {'missing'}
end
if KEYS[2] == KEYS[3] then
  return {'moved', ttl}
end
local payload = redis.call('GET', KEYS[2])
if ttl > 0 then
  redis.call('SET', KEYS[3], payload, 'PX', ttl)
else
  redis.call('SET', KEYS[3], payload)
end
redis.call('DEL', KEYS[2])
return {'moved', ttl}
