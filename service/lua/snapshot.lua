-- What /choose reads, in one round trip: version, a decision number, statistics.
--
-- KEYS[1]  meta hash   lrb:{exp}:meta
-- KEYS[2]  stats hash  lrb:{exp}:stats
--
-- Returns {version or false, decision number, field, value, field, value, ...};
-- {false} when the experiment does not exist (nothing is written then).
-- A resent call only skips a decision number: decisions are counted when
-- save_decision.lua records them.

local version = redis.call('HGET', KEYS[1], 'version')
if not version then
  return {false}
end
local number = redis.call('HINCRBY', KEYS[2], 'decision_seq', 1)
local result = {version, number}
local stats = redis.call('HGETALL', KEYS[2])
for i = 1, #stats do
  result[#result + 1] = stats[i]
end
return result
