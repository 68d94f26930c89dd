-- Return a dead consumer's entries: only while its heartbeat is still absent, and only entries
-- still in its processing list. Pairs of (entry, successor, destination flag) come in ARGV.
-- KEYS[1] processing list, KEYS[2] heartbeat key, KEYS[3] pending, KEYS[4] dead, KEYS[5] consumers
-- ARGV[1] consumer id; then triples: entry, successor, 'p' (pending) or 'd' (dead)
-- Reply: {returned, dead_lettered} or {-1} when the consumer is alive again
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {-1}
end
local returned, dead = 0, 0
for i = 2, #ARGV, 3 do
  if redis.call('LREM', KEYS[1], 1, ARGV[i]) == 1 then
    if ARGV[i + 2] == 'd' then
      redis.call('LPUSH', KEYS[4], ARGV[i + 1])
      dead = dead + 1
    else
      redis.call('LPUSH', KEYS[3], ARGV[i + 1])
      returned = returned + 1
    end
  end
end
if redis.call('LLEN', KEYS[1]) == 0 then
  redis.call('SREM', KEYS[5], ARGV[1])
end
return {returned, dead}
