-- Claim a place in a character's order of session events (sessions starting, streams closing):
-- the mark names the newest event seen, as (owner epoch, time in microseconds, event id). An
-- event at or after the mark takes it (a retry of the very event that holds it stays current);
-- an older one is stale.
-- With presence keys given, the presence record is written in the same step, only when
-- current.
-- KEYS[1] the character's order mark; optionally KEYS[2] account record, KEYS[3] character
-- record, KEYS[4] account index, KEYS[5] character index
-- ARGV[1] epoch, ARGV[2] time in micros, ARGV[3] event id, ARGV[4] mark TTL ms; with presence:
-- ARGV[5] record, ARGV[6] record TTL ms, ARGV[7] account id, ARGV[8] character id
-- Reply: 1 current (and presence written), 0 stale (nothing written)
-- (After the integer helpers of lua/ints.lua: a mark whose epoch or time is not a canonical
-- integer is corrupt and is taken over like a missing one.)
local mark = redis.call('HMGET', KEYS[1], 'epoch', 'at', 'entry')
local epoch, at = canon_int(mark[1]), canon_int(mark[2])
if epoch and at then
  local by_epoch, by_at = cmp_int(ARGV[1], epoch), cmp_int(ARGV[2], at)
  local entry = mark[3] or ''
  local older = by_epoch < 0 or (by_epoch == 0 and (by_at < 0 or (by_at == 0 and ARGV[3] < entry)))
  if older then
    return 0
  end
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'at', ARGV[2], 'entry', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if #KEYS == 5 then
  redis.call('SET', KEYS[2], ARGV[5], 'PX', ARGV[6])
  redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[6])
  redis.call('SADD', KEYS[4], ARGV[7])
  redis.call('SADD', KEYS[5], ARGV[8])
end
return 1
