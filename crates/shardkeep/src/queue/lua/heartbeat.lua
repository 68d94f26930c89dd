-- Refresh a consumer incarnation's heartbeat and (re)register it in the consumer set, in one
-- step, unless another incarnation now holds the consumer id. A consumer that recovery dropped
-- from the set during a stall is registered again by its next heartbeat or lease.
-- KEYS[1] heartbeat, KEYS[2] consumers; ARGV[1] consumer id, ARGV[2] incarnation token,
-- ARGV[3] TTL ms
-- Reply: 1 refreshed, 2 refreshed and registered again (the id had left the set), 0 the id
-- belongs to another incarnation (this one must stop)
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[2] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if redis.call('SADD', KEYS[2], ARGV[1]) == 1 then
  return 2
end
return 1
