-- A clean shutdown: hand every held entry back to the front of pending in lease order, drop the
-- heartbeat and leave the consumer set, all at once, but only while this incarnation still
-- holds its id (or nobody does): entries of an incarnation that took the id over are its own.
-- KEYS[1] processing list, KEYS[2] pending, KEYS[3] heartbeat, KEYS[4] consumers, KEYS[5] held
-- counts, KEYS[6] held total
-- ARGV[1] consumer id, ARGV[2] incarnation token, ARGV[3] most entries to move
-- Reply: entries moved, or -1 when another incarnation holds the id (nothing touched)
local holder = redis.call('GET', KEYS[3])
if holder and holder ~= ARGV[2] then
  return -1
end
local moved = 0
local max = tonumber(ARGV[3])
while moved < max do
  if not redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT') then
    break
  end
  moved = moved + 1
end
recount(KEYS[1], KEYS[5], KEYS[6], ARGV[1])
redis.call('DEL', KEYS[3])
redis.call('SREM', KEYS[4], ARGV[1])
return moved
