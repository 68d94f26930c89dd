-- Prelude of every script that moves entries into or out of a processing list: sets the list's
-- field of the held counts from the list's length (the truth, O(1)) and moves the total by the
-- difference, so the depth report reads one key however many consumers there are, and a count
-- that went wrong (a BLMOVE whose follow-up never ran, a list deleted by hand) is put right the
-- next time any script touches that list.
-- recount(list, held hash, total, consumer id) -> entries the list holds
local function recount(list, held, total, id)
  local now = redis.call('LLEN', list)
  local was = tonumber(redis.call('HGET', held, id) or '0')
  if now ~= was then
    redis.call('INCRBY', total, now - was)
    if now == 0 then
      redis.call('HDEL', held, id)
    else
      redis.call('HSET', held, id, now)
    end
  end
  return now
end
