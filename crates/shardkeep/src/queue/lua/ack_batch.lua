-- Remove entries from this consumer's processing list.
-- KEYS[1] processing, KEYS[2] held counts, KEYS[3] held total; ARGV[1] consumer id, then the
-- entries as leased
-- Reply: one flag per entry (1 acked, 0 stale)
local result = {}
for i = 2, #ARGV do
  result[i - 1] = redis.call('LREM', KEYS[1], 1, ARGV[i])
end
recount(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
return result
