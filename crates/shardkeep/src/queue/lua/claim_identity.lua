-- Claim a stable consumer id for a new incarnation: only when no incarnation holds it (its
-- heartbeat lapsed, or was released by a clean shutdown).
-- KEYS[1] heartbeat, KEYS[2] consumers; ARGV[1] consumer id, ARGV[2] incarnation token,
-- ARGV[3] TTL ms
-- Reply: {'claimed'} or {'held', remaining ms}
local remaining = redis.call('PTTL', KEYS[1])
if remaining ~= -2 then
  return {'held', remaining}
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('SADD', KEYS[2], ARGV[1])
return {'claimed'}
