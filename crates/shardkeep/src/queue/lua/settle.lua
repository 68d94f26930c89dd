-- Remove one entry from a processing list and push its successor (a retry back to pending, or a
-- dead letter), atomically.
-- KEYS[1] processing list, KEYS[2] destination (pending or dead); ARGV[1] the entry as leased,
-- ARGV[2] what to push
-- Reply: 1 moved, 0 stale (the entry was no longer in the processing list)
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then
  return 0
end
redis.call('LPUSH', KEYS[2], ARGV[2])
return 1
