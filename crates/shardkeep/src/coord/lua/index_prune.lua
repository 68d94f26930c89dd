-- Remove index-set members whose payload key no longer exists; checked and removed atomically so
-- a member re-added by a concurrent write is never dropped.
-- KEYS[1] index set, KEYS[2..n] payload keys; ARGV[i] the member whose payload is KEYS[i + 1]
-- Reply: number of members removed
local removed = 0
for i = 2, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then
    removed = removed + redis.call('SREM', KEYS[1], ARGV[i - 1])
  end
end
return removed
