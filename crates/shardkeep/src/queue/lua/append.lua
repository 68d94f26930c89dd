-- Append one entry to pending, refusing when a cap is set and reached.
-- KEYS[1] pending; ARGV[1] encoded entry, ARGV[2] cap (0: none)
-- Reply: new pending length, or -1 when full
local cap = tonumber(ARGV[2])
if cap > 0 and redis.call('LLEN', KEYS[1]) >= cap then
  return -1
end
return redis.call('LPUSH', KEYS[1], ARGV[1])
