-- Remove entries from this consumer's processing list.
-- KEYS[1] processing; ARGV the entries as leased
-- Reply: one flag per entry (1 acked, 0 stale)
local result = {}
for i = 1, #ARGV do
  result[i] = redis.call('LREM', KEYS[1], 1, ARGV[i])
end
return result
