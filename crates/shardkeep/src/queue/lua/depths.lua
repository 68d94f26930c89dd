-- Pending, processing (every consumer, from the total the moving scripts keep) and dead depths,
-- in one round trip of O(1) work.
-- KEYS[1] pending, KEYS[2] dead, KEYS[3] held total
-- Reply: {pending, processing, dead}
local held = tonumber(redis.call('GET', KEYS[3]) or '0')
if held < 0 then
  held = 0
end
return {redis.call('LLEN', KEYS[1]), held, redis.call('LLEN', KEYS[2])}
