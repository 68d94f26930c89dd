-- Sets the processing total to the sum of the held counts, in one step, so a total that drifted
-- from them (deleted, or moved by hand) cannot stay wrong; skipped past a bound of counts.
-- KEYS[1] held counts, KEYS[2] held total
-- ARGV[1] most counts summed
-- Reply: {sum, total before}, or {-1, total before} when there are more counts than the bound
local was = tonumber(redis.call('GET', KEYS[2]) or '0')
if redis.call('HLEN', KEYS[1]) > tonumber(ARGV[1]) then
  return {-1, was}
end
local sum = 0
for _, count in ipairs(redis.call('HVALS', KEYS[1])) do
  sum = sum + tonumber(count)
end
if sum ~= was then
  if sum == 0 then
    redis.call('DEL', KEYS[2])
  else
    redis.call('SET', KEYS[2], sum)
  end
end
return {sum, was}
