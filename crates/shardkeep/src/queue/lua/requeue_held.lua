-- Move a consumer's held entries back to the front of pending (the end leases take from), in
-- the order they were leased: newest first, so the oldest ends up leased first. Used for leases
-- whose replies were lost and for entries that failed during a pass, only while this
-- incarnation still holds its id: entries of an incarnation that took the id over are its own.
-- KEYS[1] the consumer's processing list, KEYS[2] pending, KEYS[3] heartbeat, KEYS[4] held
-- counts, KEYS[5] held total
-- ARGV[1] most entries to move, ARGV[2] incarnation token, ARGV[3] consumer id
-- Reply: entries moved, or -1 when another incarnation holds the id (nothing moved)
local holder = redis.call('GET', KEYS[3])
if holder and holder ~= ARGV[2] then
  return -1
end
local moved = 0
local max = tonumber(ARGV[1])
while moved < max do
  local entry = redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
  if not entry then
    break
  end
  moved = moved + 1
end
recount(KEYS[1], KEYS[4], KEYS[5], ARGV[3])
return moved
