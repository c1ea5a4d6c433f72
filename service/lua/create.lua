-- Create an experiment unless one with this id exists.
--
-- KEYS[1]  meta hash   lrb:{exp}:meta
-- KEYS[2]  arms hash   lrb:{exp}:arms
-- KEYS[3]  stats hash  lrb:{exp}:stats
-- KEYS[4]  outcomes    lrb:{exp}:outcomes (created empty: see service.keys.outcomes)
-- ARGV[1]  number m of meta (field, value) pairs, then the pairs (one of
--          them the initial "version", random so that a re-created
--          experiment never repeats a version another worker has cached)
-- ARGV[2+2m..]  arm id, arm JSON, ...
--
-- Returns 1 when created, 0 when the id is taken. A resend of a call that
-- created it (the client retries a command whose reply was lost) finds its
-- own incarnation there and returns 1 again.

local m = tonumber(ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 then
  for i = 0, m - 1 do
    if ARGV[2 + 2 * i] == 'incarnation' then
      return redis.call('HGET', KEYS[1], 'incarnation') == ARGV[3 + 2 * i] and 1 or 0
    end
  end
  return 0
end
for i = 0, m - 1 do
  redis.call('HSET', KEYS[1], ARGV[2 + 2 * i], ARGV[3 + 2 * i])
end
for i = 2 + 2 * m, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
redis.call('HSET', KEYS[3], 'decisions', 0, 'rewards', 0, 'duplicates', 0)
-- A shard of a sharded experiment numbers its decisions from its own start
-- (service.shards.numbering).
local start = redis.call('HGET', KEYS[1], 'number_start')
if start then
  redis.call('HSET', KEYS[3], 'decision_seq', start)
end
redis.call('SET', KEYS[4], '')
return 1
