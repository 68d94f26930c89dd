-- Remove dead letters past retention from the list and the index, atomically per letter.
-- KEYS[1] dead, KEYS[2] dead-letter index; ARGV pairs: the dead letter as stored, its id ('' when
-- it has none that can be read)
-- Reply: dead letters removed
local removed = 0
for i = 1, #ARGV, 2 do
  if redis.call('LREM', KEYS[1], -1, ARGV[i]) == 1 then
    removed = removed + 1
  end
  if ARGV[i + 1] ~= '' then
    redis.call('HDEL', KEYS[2], ARGV[i + 1])
  end
end
return removed
