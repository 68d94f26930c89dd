-- Pending, processing (every consumer) and dead depths in one round trip.
-- KEYS[1] pending, KEYS[2] dead, KEYS[3] consumers; ARGV[1] processing-list prefix (from the
-- keyspace), ARGV[2] most consumers to visit
-- Reply: {pending, processing, dead, consumers visited}
local processing, visited = 0, 0
local cursor = '0'
local limit = tonumber(ARGV[2])
repeat
  local page = redis.call('SSCAN', KEYS[3], cursor, 'COUNT', 100)
  cursor = page[1]
  for _, id in ipairs(page[2]) do
    if visited < limit then
      processing = processing + redis.call('LLEN', ARGV[1] .. id)
      visited = visited + 1
    end
  end
until cursor == '0' or visited >= limit
return {redis.call('LLEN', KEYS[1]), processing, redis.call('LLEN', KEYS[2]), visited}
