-- Retire arms: they keep their statistics but are no longer chosen.
--
-- KEYS[1]  meta hash  lrb:{exp}:meta
-- KEYS[2]  arms hash  lrb:{exp}:arms
-- ARGV     arm ids
--
-- Returns the new version, 0 if the experiment is gone, -1 if an id is unknown.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
for i = 1, #ARGV do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 0 then
    return -1
  end
end
for i = 1, #ARGV do
  local arm = cjson.decode(redis.call('HGET', KEYS[2], ARGV[i]))
  arm['active'] = false
  redis.call('HSET', KEYS[2], ARGV[i], cjson.encode(arm))
end
return redis.call('HINCRBY', KEYS[1], 'version', 1)
