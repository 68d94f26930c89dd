-- A session cleanup's resume ledger, ordered: the stored record carries the place of the event
-- that stored it, as "order": [epoch, micros, event id]. A store never replaces a record stored
-- by a newer event; a take-back deletes the record only if this very event stored it.
-- KEYS[1] the resume ledger
-- ARGV[1] 'store' or 'take_back', ARGV[2] epoch, ARGV[3] time in micros, ARGV[4] event id;
-- for 'store': ARGV[5] the record, ARGV[6] TTL ms
-- Reply: 1 stored (or taken back), 0 nothing done
-- A stored order whose epoch or time is not a whole number that a double holds exactly (text,
-- infinity, NaN, a fraction, beyond 2^53: nothing shardkeep writes) is corrupt: the record is
-- taken over like one without an order, never compared.
local EXACT = 9007199254740992
local function whole(v)
  if type(v) ~= 'number' or v ~= v or v >= EXACT or v <= -EXACT or math.floor(v) ~= v then
    return nil
  end
  return v
end
local existing = redis.call('GET', KEYS[1])
local stored = nil
if existing then
  local ok, decoded = pcall(cjson.decode, existing)
  if ok and type(decoded) == 'table' and type(decoded.order) == 'table' then
    local epoch, at, id = whole(decoded.order[1]), whole(decoded.order[2]), decoded.order[3]
    if epoch and at and type(id) == 'string' then
      stored = {epoch, at, id}
    end
  end
end
local mine = {tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]}
if ARGV[1] == 'store' then
  if stored then
    local older = mine[1] < stored[1]
      or (mine[1] == stored[1] and (mine[2] < stored[2] or (mine[2] == stored[2] and mine[3] < stored[3])))
    if older then
      return 0
    end
  end
  redis.call('SET', KEYS[1], ARGV[5], 'PX', ARGV[6])
  return 1
end
if stored and stored[1] == mine[1] and stored[2] == mine[2] and stored[3] == mine[3] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
