-- Refresh an instance registration; re-index it if the index lost it.
-- KEYS[1] instance record, KEYS[2] instance index; ARGV[1] TTL in ms, ARGV[2] instance id
-- Reply: 1 refreshed, 0 not registered (expired or never written)
if redis.call('PEXPIRE', KEYS[1], ARGV[1]) == 1 then
  redis.call('SADD', KEYS[2], ARGV[2])
  return 1
end
return 0
