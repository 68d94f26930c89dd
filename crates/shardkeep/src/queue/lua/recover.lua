-- Return a dead consumer's entries to the front of pending, in order: only while its heartbeat
-- is held by the expected holder (absent, for a consumer presumed dead; this incarnation's own
-- token, for a stable id claiming its predecessor's entries), and only entries still in its
-- processing list. Quads come newest first, so the oldest ends up leased first.
-- KEYS[1] processing list, KEYS[2] heartbeat, KEYS[3] pending, KEYS[4] dead, KEYS[5] consumers,
-- KEYS[6] dead-letter index, KEYS[7] held counts, KEYS[8] held total
-- ARGV[1] consumer id, ARGV[2] expected heartbeat holder ('' for none); then quads: entry,
-- successor, 'p' (pending) or 'd' (dead), dead letter id ('' for pending)
-- Reply: {returned, dead_lettered} or {-1} when the heartbeat is not as expected
local holder = redis.call('GET', KEYS[2])
if ARGV[2] == '' then
  if holder then
    return {-1}
  end
elseif holder ~= ARGV[2] then
  return {-1}
end
local returned, dead = 0, 0
for i = 3, #ARGV, 4 do
  if redis.call('LREM', KEYS[1], 1, ARGV[i]) == 1 then
    if ARGV[i + 2] == 'd' then
      redis.call('LPUSH', KEYS[4], ARGV[i + 1])
      redis.call('HSET', KEYS[6], ARGV[i + 3], ARGV[i + 1])
      dead = dead + 1
    else
      redis.call('RPUSH', KEYS[3], ARGV[i + 1])
      returned = returned + 1
    end
  end
end
if recount(KEYS[1], KEYS[7], KEYS[8], ARGV[1]) == 0 and ARGV[2] == '' then
  redis.call('SREM', KEYS[5], ARGV[1])
end
return {returned, dead}
