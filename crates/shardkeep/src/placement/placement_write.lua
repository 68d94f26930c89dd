-- Write a placement record unless a newer owner already wrote one (after the integer helpers
-- of lua/ints.lua).
-- KEYS[1] placement hash; ARGV[1] writer's owner epoch, ARGV[2] record JSON, ARGV[3] TTL ms
-- Reply: {'ok'} | {'stale', stored epoch}
-- A stored epoch that is not a canonical integer marks the hash corrupt: it is replaced like a
-- key of another type.
local kind = redis.call('TYPE', KEYS[1]).ok
local corrupt = kind ~= 'none' and kind ~= 'hash'
if kind == 'hash' then
  local text = redis.call('HGET', KEYS[1], 'epoch')
  local stored = canon_int(text)
  if text and not stored then
    corrupt = true
  elseif stored and cmp_int(stored, ARGV[1]) > 0 then
    return {'stale', stored}
  end
end
if corrupt then
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'record', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'ok'}
