-- Move up to ARGV[1] of the oldest pending entries into this consumer's processing list.
-- KEYS[1] pending, KEYS[2] processing
-- Reply: the moved entries, oldest first
local items = redis.call('RPOP', KEYS[1], ARGV[1])
if not items then
  return {}
end
for i = 1, #items do
  redis.call('LPUSH', KEYS[2], items[i])
end
return items
