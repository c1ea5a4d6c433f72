-- Release a claim (keys.creating) if it is still the caller's: after it expired
-- another caller may hold it.
--
-- KEYS[1]  the claim   lrb:{exp}:creating
-- ARGV[1]  the caller's token
--
-- Returns 1 when released, 0 when the claim was not the caller's.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
