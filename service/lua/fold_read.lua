-- Read what a fold needs: the oldest outcomes not yet in the sums, and the sums
-- they add to.
--
-- KEYS[1]  meta hash   lrb:{exp}:meta
-- KEYS[2]  stats hash  lrb:{exp}:stats  (packed sums; counters outcomes and folded;
--                      outcome 'u:<n>' for folded < n <= outcomes: outcomes.lua)
-- ARGV[1]  how many outcomes, at most
--
-- Returns {} when the experiment does not exist, else {incarnation, folded,
-- outcomes, fields, blobs}: the folded counter as it is now, outcomes
-- folded + 1, folded + 2, ... (up to ARGV[1] of them), and the fields (model
-- and arm) they add to with their blobs (false for a field not written yet).
-- It writes nothing: fold.lua writes the sums back only if no fold came between.

local incarnation = redis.call('HGET', KEYS[1], 'incarnation')
if not incarnation then
  return {}
end
local counters = redis.call('HMGET', KEYS[2], 'folded', 'outcomes')
local folded = tonumber(counters[1] or '0')
local last = math.min(tonumber(counters[2] or '0'), folded + tonumber(ARGV[1]))
if last <= folded then
  return {incarnation, tostring(folded), {}, {}, {}}
end
local names = {}
for n = folded + 1, last do
  names[#names + 1] = 'u:' .. n
end
local outcomes = redis.call('HMGET', KEYS[2], unpack(names))
local fields, seen = {}, {}
for _, outcome in ipairs(outcomes) do
  local model, arm = string.match(outcome, '^([^\n]*)\n([^\n]*)\n')
  for _, name in ipairs({model, arm}) do
    if not seen[name] then
      seen[name] = true
      fields[#fields + 1] = name
    end
  end
end
return {incarnation, tostring(folded), outcomes, fields, redis.call('HMGET', KEYS[2], unpack(fields))}
