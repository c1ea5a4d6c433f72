-- Make a member of a sharded experiment (service.shards) hold its home's definition.
--
-- KEYS[1]  the member's meta hash   lrb:{exp~s}:meta
-- KEYS[2]  the member's arms hash   lrb:{exp~s}:arms
-- ARGV[1]  the home's incarnation: a member of another one (left by a deletion that
--          stopped halfway) is not touched
-- ARGV[2]  m: how many meta (field, value) pairs follow, then the pairs: the home's
--          definition fields as this member keeps them (its version among them)
-- ARGV[3 + 2m]  n: how many meta fields follow to delete (absent at the home), then them
-- ARGV[4 + 2m + n ..]  arm id, arm JSON, ...: the home's arms (arms are never removed)
--
-- Returns 1 when the member holds the home's definition now, 0 when it does not
-- exist, -1 when it belongs to another incarnation, 2 when it holds a newer
-- definition already (versions only grow within an incarnation: a copy read
-- before a later change never undoes it). Writing the same twice changes
-- nothing: any worker may repair a member left behind.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local held = redis.call('HMGET', KEYS[1], 'incarnation', 'version')
if held[1] ~= ARGV[1] then
  return -1
end
local m = tonumber(ARGV[2])
for i = 0, m - 1 do
  if ARGV[3 + 2 * i] == 'version' and tonumber(held[2]) > tonumber(ARGV[4 + 2 * i]) then
    return 2
  end
end
for i = 0, m - 1 do
  redis.call('HSET', KEYS[1], ARGV[3 + 2 * i], ARGV[4 + 2 * i])
end
local at = 3 + 2 * m
local n = tonumber(ARGV[at])
for i = 1, n do
  redis.call('HDEL', KEYS[1], ARGV[at + i])
end
for i = at + n + 1, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
return 1
