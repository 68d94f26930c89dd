-- Move a consumer's held entries back to pending, oldest first, to the end leases take from: a
-- lease whose reply was lost left its entry here while the consumer thought it held nothing.
-- KEYS[1] the consumer's processing list, KEYS[2] pending; ARGV[1] most entries to move
-- Reply: entries moved
local moved = 0
local max = tonumber(ARGV[1])
while moved < max do
  local entry = redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'RIGHT')
  if not entry then
    break
  end
  moved = moved + 1
end
return moved
