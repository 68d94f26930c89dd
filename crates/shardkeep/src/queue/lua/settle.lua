-- Remove one entry from a processing list and push its successor, atomically: a retry goes back
-- to the front of pending (the end leases take from, so it keeps its place in line), a dead
-- letter to the newest end of the dead list and into the index by id.
-- KEYS[1] processing list, KEYS[2] destination (pending, dead, or the processing list itself),
-- KEYS[3] dead-letter index, KEYS[4] held counts, KEYS[5] held total;
-- ARGV[1] the entry as leased, ARGV[2] what to push, ARGV[3] 'front' (RPUSH: leased next) or
-- 'newest' (LPUSH), ARGV[4] the dead letter's id ('' unless the destination is dead),
-- ARGV[5] consumer id
-- Reply: 1 moved, 0 stale (the entry was no longer in the processing list)
local moved = 0
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  moved = 1
  if ARGV[3] == 'front' then
    redis.call('RPUSH', KEYS[2], ARGV[2])
  else
    redis.call('LPUSH', KEYS[2], ARGV[2])
  end
  if ARGV[4] ~= '' then
    redis.call('HSET', KEYS[3], ARGV[4], ARGV[2])
  end
end
recount(KEYS[1], KEYS[4], KEYS[5], ARGV[5])
return moved
