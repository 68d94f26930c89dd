-- Move up to ARGV[1] of the oldest pending entries into this consumer's processing list, and
-- refresh its heartbeat and registration in the same step (so a consumer that leases and then
-- dies is always found by recovery).
-- KEYS[1] pending, KEYS[2] processing, KEYS[3] heartbeat, KEYS[4] consumers, KEYS[5] held
-- counts, KEYS[6] held total
-- ARGV[1] most entries, ARGV[2] consumer id, ARGV[3] incarnation token, ARGV[4] TTL ms
-- Reply: the moved entries, oldest first; or the error 'identity_lost' (nothing moved) when
-- another incarnation holds the consumer id
local holder = redis.call('GET', KEYS[3])
if holder and holder ~= ARGV[3] then
  return redis.error_reply('identity_lost')
end
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
redis.call('SADD', KEYS[4], ARGV[2])
local items = redis.call('RPOP', KEYS[1], ARGV[1])
if not items then
  return {}
end
for i = 1, #items do
  redis.call('LPUSH', KEYS[2], items[i])
end
recount(KEYS[2], KEYS[5], KEYS[6], ARGV[2])
return items
