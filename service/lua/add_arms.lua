-- Register new arms at the end of the arm order.
--
-- KEYS[1]  meta hash  lrb:{exp}:meta
-- KEYS[2]  arms hash  lrb:{exp}:arms
-- ARGV[1]  the most arms an experiment may have (max_arms)
-- ARGV[2..]  arm id, JSON without index (the script appends "index"), ...
--
-- Returns the new version, 0 if the experiment is gone, -1 if an id exists,
-- -2 if there would be more than ARGV[1] arms (checked here, so that
-- concurrent additions cannot together exceed it).

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local next_index = redis.call('HLEN', KEYS[2])
if next_index + (#ARGV - 1) / 2 > tonumber(ARGV[1]) then
  return -2
end
for i = 2, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 1 then
    return -1
  end
end
for i = 2, #ARGV, 2 do
  local arm = cjson.decode(ARGV[i + 1])
  arm['index'] = next_index
  next_index = next_index + 1
  redis.call('HSET', KEYS[2], ARGV[i], cjson.encode(arm))
end
return redis.call('HINCRBY', KEYS[1], 'version', 1)
