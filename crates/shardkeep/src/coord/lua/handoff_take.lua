-- Take the first handoff for a token across its scopes, once.
-- KEYS[1]      consumed marker of the token
-- KEYS[2..n]   the token's handoff keys, in take order (instance, placement, port)
-- ARGV[1]      consumed-marker TTL in milliseconds
-- Reply: {'consumed'} | {'missing'} | {'taken', index (1-based among scopes), payload}
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {'consumed'}
end
for i = 2, #KEYS do
  local payload = redis.call('GET', KEYS[i])
  if payload then
    for j = 2, #KEYS do
      redis.call('DEL', KEYS[j])
    end
    redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
    return {'taken', tostring(i - 1), payload}
  end
end
return {'missing'}
