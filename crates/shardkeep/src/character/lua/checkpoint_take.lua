-- New owners take checkpoints over (after the integer helpers of lua/ints.lua): each stored
-- content stays, its guard rises to its claimant's epoch, so a copy the claim superseded can no
-- longer write it, and the checkpoint lives a full TTL again. One call carries any number of
-- take-overs (all in one cluster slot): the call's own cost is paid once for all of them.
-- KEYS[i] checkpoint hash i; ARGV[1] TTL ms; ARGV[i+1] the owner epoch of key i's claimant
-- Reply: per key, in order, {'none'} | {'corrupt', why} | {'held', guard before the call, JSON}
-- A guard above the claimant's epoch (a later claim took it first) is left as it is; a raise
-- keeps the guard it replaced in `taken_from`, the answer to a repeat of the same take-over. A
-- hash without a snapshot holds nothing; a value of another type, or a guard that is not a
-- canonical integer, is reported corrupt and left for the next write to replace.
local function take_one(key, ttl, claimant)
  local stored = redis.pcall('HMGET', key, 'epoch', 'snapshot')
  if stored.err then
    return {'corrupt', 'not a checkpoint hash'}
  end
  if not stored[2] then
    return {'none'}
  end
  local guard = canon_int(stored[1])
  if not guard then
    return {'corrupt', 'guard epoch is not an integer'}
  end
  local order = cmp_int(guard, claimant)
  if order < 0 then
    redis.call('HSET', key, 'epoch', claimant, 'taken_from', guard)
    redis.call('PEXPIRE', key, ttl)
  elseif order == 0 then
    -- The claimant's own take-over again (its reply was lost, or its pipeline went twice): it
    -- is told the guard it found the first time, not the one it raised.
    local before = canon_int(redis.call('HGET', key, 'taken_from'))
    if before then
      guard = before
    end
  end
  return {'held', guard, stored[2]}
end

local replies = {}
for i, key in ipairs(KEYS) do
  replies[i] = take_one(key, ARGV[1], ARGV[i + 1])
end
return replies
