-- Register new arms at the end of the arm order.
--
-- KEYS[1]  meta hash  lrb:{exp}:meta
-- KEYS[2]  arms hash  lrb:{exp}:arms
-- KEYS[3]  the experiment's calls hash, and ARGV's last: this call's token (once.lua)
-- ARGV[1]  the most arms an experiment may have (max_arms)
-- ARGV[2..]  arm id, JSON object without index (the script adds "index"), ...
--
-- Returns the new version, 0 if the experiment is gone, -1 if an id exists,
-- -2 if there would be more than ARGV[1] arms (checked here, so that
-- concurrent additions cannot together exceed it).

local resent = answered()  -- once.lua
if resent then
  return resent
end
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
-- The record as the service wrote it, its index put first (ARGV's JSON is an object
-- with fields): cjson.encode would write the features with 14 significant digits, not
-- the 17 a double needs.
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i],
             string.format('{"index": %d, ', next_index) .. string.sub(ARGV[i + 1], 2))
  next_index = next_index + 1
end
return made(redis.call('HINCRBY', KEYS[1], 'version', 1))
