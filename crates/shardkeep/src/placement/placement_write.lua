-- Write a placement record unless a newer owner already wrote one, or the writer's own copy
-- already left (after the integer helpers of lua/ints.lua).
-- KEYS[1] placement hash; ARGV[1] writer's owner epoch, ARGV[2] record JSON, ARGV[3] TTL ms,
-- ARGV[4] '1' for a tombstone, '0' for a live placement
-- Reply: {'ok'} | {'stale', stored epoch} | {'left', stored epoch}
-- A copy places itself only while it is held, and its logout's tombstone is written once it
-- has left: a live placement of the tombstone's own epoch was queued before the logout and
-- landed after it (a race between two writes of one copy), so it is refused. A stored epoch
-- that is not a canonical integer marks the hash corrupt: it is replaced like a key of another
-- type.
local kind = redis.call('TYPE', KEYS[1]).ok
local corrupt = kind ~= 'none' and kind ~= 'hash'
if kind == 'hash' then
  local stored_fields = redis.call('HMGET', KEYS[1], 'epoch', 'tomb')
  local text = stored_fields[1]
  local stored = canon_int(text)
  if text and not stored then
    corrupt = true
  elseif stored then
    local order = cmp_int(stored, ARGV[1])
    if order > 0 then
      return {'stale', stored}
    elseif order == 0 and stored_fields[2] == '1' and ARGV[4] ~= '1' then
      return {'left', stored}
    end
  end
end
if corrupt then
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'record', ARGV[2], 'tomb', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'ok'}
