-- Return a presence record only if its counterpart agrees; otherwise delete it.
-- KEYS[1] record key, KEYS[2] index set holding the record's id, KEYS[3] counterpart record key
-- ARGV[1] the record's id in KEYS[2], ARGV[2] the raw record the caller read
-- Reply: {'ok', raw, milliseconds the record has left} | {'missing'} | {'changed'} | {'mismatch'}
local raw = redis.call('GET', KEYS[1])
if not raw then
  redis.call('SREM', KEYS[2], ARGV[1])
  return {'missing'}
end
if raw ~= ARGV[2] then
  return {'changed'}
end
local consistent = false
local other_raw = redis.call('GET', KEYS[3])
if other_raw then
  local ok_a, rec = pcall(cjson.decode, raw)
  local ok_b, other = pcall(cjson.decode, other_raw)
  if ok_a and ok_b and type(rec) == 'table' and type(other) == 'table' then
    consistent = rec.account_id == other.account_id
      and rec.character_id == other.character_id
      and rec.session_token == other.session_token
  end
end
if consistent then
  return {'ok', raw, redis.call('PTTL', KEYS[1])}
end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
return {'mismatch'}
