-- A new owner takes the checkpoint over (after the integer helpers of lua/ints.lua): the stored
-- content stays, the guard rises to the claimant's epoch, so a copy the claim superseded can
-- no longer write it, and the checkpoint lives a full TTL again.
-- KEYS[1] checkpoint hash; ARGV[1] TTL ms; ARGV[2] the claimant's owner epoch
-- Reply: {'none'} | {'corrupt', why} | {'held', guard epoch before the call, snapshot JSON}
-- A guard at or above the claimant's epoch (a later claim took it first) is left as it is. A hash without a snapshot holds nothing; a value of another type, or a guard that
-- is not a canonical integer, is reported corrupt and left for the next write to replace.
local key, ttl, claimant = KEYS[1], ARGV[1], ARGV[2]
local kind = redis.call('TYPE', key).ok
if kind == 'none' then
  return {'none'}
end
if kind ~= 'hash' then
  return {'corrupt', 'not a checkpoint hash'}
end
local stored = redis.call('HMGET', key, 'epoch', 'snapshot')
if not stored[2] then
  return {'none'}
end
local guard = canon_int(stored[1])
if not guard then
  return {'corrupt', 'guard epoch is not an integer'}
end
if cmp_int(guard, claimant) < 0 then
  redis.call('HSET', key, 'epoch', claimant)
  redis.call('PEXPIRE', key, ttl)
end
return {'held', guard, stored[2]}
