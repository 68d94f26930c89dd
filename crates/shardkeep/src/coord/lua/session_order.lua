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
local mark = redis.call('HMGET', KEYS[1], 'epoch', 'at', 'entry')
if mark[1] then
  local epoch, at = tonumber(mark[1]), tonumber(mark[2])
  local mine_epoch, mine_at = tonumber(ARGV[1]), tonumber(ARGV[2])
  local older = mine_epoch < epoch
    or (mine_epoch == epoch and (mine_at < at or (mine_at == at and ARGV[3] < mark[3])))
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
