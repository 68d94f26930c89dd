-- Append entries to pending in the order given, refusing those past the cap.
-- KEYS[1] pending; ARGV[1] cap (entries), ARGV[2..] encoded entries
-- Reply: how many of the entries (from the first) were appended; the rest were refused
local cap = tonumber(ARGV[1])
local room = cap - redis.call('LLEN', KEYS[1])
local take = math.min(math.max(room, 0), #ARGV - 1)
for i = 2, take + 1 do
  redis.call('LPUSH', KEYS[1], ARGV[i])
end
return take
