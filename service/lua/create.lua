-- Create an experiment unless one with this id exists.
--
-- KEYS[1]  meta hash   lrb:{exp}:meta
-- KEYS[2]  arms hash   lrb:{exp}:arms
-- KEYS[3]  stats hash  lrb:{exp}:stats
-- ARGV[1]  number m of meta (field, value) pairs, then the pairs (one of
--          them the initial "version", random so that a re-created
--          experiment never repeats a version another worker has cached)
-- ARGV[2+2m..]  arm id, arm JSON, ...
--
-- Returns 1 when created, 0 when the id is taken.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local m = tonumber(ARGV[1])
for i = 0, m - 1 do
  redis.call('HSET', KEYS[1], ARGV[2 + 2 * i], ARGV[3 + 2 * i])
end
for i = 2 + 2 * m, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
redis.call('HSET', KEYS[3], 'decisions', 0, 'rewards', 0, 'duplicates', 0)
return 1
