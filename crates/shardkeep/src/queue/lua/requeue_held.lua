-- Move a consumer's held entries back to the front of pending (the end leases take from), in
-- the order they were leased: newest first, so the oldest ends up leased first. Used for leases
-- whose replies were lost, and by a clean shutdown.
-- KEYS[1] the consumer's processing list, KEYS[2] pending; ARGV[1] most entries to move
-- Reply: entries moved
local moved = 0
local max = tonumber(ARGV[1])
while moved < max do
  local entry = redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
  if not entry then
    break
  end
  moved = moved + 1
end
return moved
