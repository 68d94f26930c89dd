-- Count one attempt in a fixed window that starts at the first attempt.
-- KEYS[1] throttle counter; ARGV[1] window in milliseconds
-- Reply: {count, remaining window in ms}
local count = redis.call('INCR', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
return {count, ttl}
