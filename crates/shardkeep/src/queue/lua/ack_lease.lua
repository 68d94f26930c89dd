-- Ack the entries a consumer finished and lease its next ones, in one step: remove the acked
-- entries from its processing list, refresh its heartbeat and registration, and move up to
-- ARGV[1] of the oldest pending entries in (as lease_batch.lua), only while this incarnation
-- holds its id.
-- KEYS[1] pending, KEYS[2] processing, KEYS[3] heartbeat, KEYS[4] consumers, KEYS[5] held
-- counts, KEYS[6] held total
-- ARGV[1] most entries to lease, ARGV[2] consumer id, ARGV[3] incarnation token, ARGV[4] TTL ms,
-- ARGV[5..] the entries to ack, as leased
-- Reply: {one flag per acked entry (1 acked, 0 stale), the newly leased entries, oldest first};
-- or the error 'identity_lost' (nothing touched) when another incarnation holds the id
local holder = redis.call('GET', KEYS[3])
if holder and holder ~= ARGV[3] then
  return redis.error_reply('identity_lost')
end
local flags = {}
for i = 5, #ARGV do
  flags[i - 4] = redis.call('LREM', KEYS[2], 1, ARGV[i])
end
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
redis.call('SADD', KEYS[4], ARGV[2])
local items = redis.call('RPOP', KEYS[1], ARGV[1]) or {}
for i = 1, #items do
  redis.call('LPUSH', KEYS[2], items[i])
end
recount(KEYS[2], KEYS[5], KEYS[6], ARGV[2])
return {flags, items}
