-- Retire arms: they keep their statistics but are no longer chosen.
--
-- KEYS[1]  meta hash  lrb:{exp}:meta
-- KEYS[2]  arms hash  lrb:{exp}:arms
-- KEYS[3]  the experiment's calls hash, and ARGV's last: this call's token (once.lua)
-- ARGV     arm ids
--
-- Returns the new version, 0 if the experiment is gone, -1 if an id is unknown,
-- -2 if no active arm would be left (checked here, so that concurrent
-- retirements cannot together retire every arm).

local resent = answered()  -- once.lua
if resent then
  return resent
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
for i = 1, #ARGV do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 0 then
    return -1
  end
end
local retiring = {}
for i = 1, #ARGV do
  retiring[ARGV[i]] = true
end
local left = false
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  if not retiring[all[i]] and cjson.decode(all[i + 1])['active'] then
    left = true
    break
  end
end
if not left then
  return -2
end
-- Only the flag changes, the rest of the record as written: cjson.encode would write
-- the features with 14 significant digits, not the 17 a double needs.
for i = 1, #ARGV do
  local record = redis.call('HGET', KEYS[2], ARGV[i])
  local retired, found = string.gsub(record, '"active"%s*:%s*true', '"active": false', 1)
  if found == 0 then  -- (not as the service writes it, or retired already)
    local arm = cjson.decode(record)
    if arm['active'] then
      arm['active'] = false
      retired = cjson.encode(arm)
    end
  end
  redis.call('HSET', KEYS[2], ARGV[i], retired)
end
return made(redis.call('HINCRBY', KEYS[1], 'version', 1))
