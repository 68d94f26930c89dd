-- Turn one dead letter back into a fresh pending entry, once.
-- KEYS[1] dead, KEYS[2] pending, KEYS[3] dead-letter index; ARGV[1] the dead letter as stored,
-- ARGV[2] the new entry, ARGV[3] the dead letter's id
-- Reply: 1 requeued, 0 not found (already requeued by someone else)
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then
  return 0
end
redis.call('HDEL', KEYS[3], ARGV[3])
redis.call('LPUSH', KEYS[2], ARGV[2])
return 1
