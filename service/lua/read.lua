-- Read hashes of one experiment together: a consistent snapshot in one round trip.
--
-- A script, not MULTI/EXEC: redis-py's asyncio cluster client sends scripts
-- as it sends any command, while its transactions fail on HGETALL. It writes
-- nothing.
--
-- KEYS[1..n]  hashes sharing one hash tag (lrb:{exp}:meta, :arms, :stats), then
--             the strings, if any (lrb:{exp}:outcomes)
-- ARGV[1]     how many of KEYS are hashes (absent: all of them)
--
-- Returns {HGETALL KEYS[1], ..., GET KEYS[h + 1], ...}: a flat field, value
-- list per hash (empty for a hash that does not exist), then each string
-- ('' for a string that does not exist).

local hashes = tonumber(ARGV[1] or '') or #KEYS
local reply = {}
for i = 1, #KEYS do
  if i <= hashes then
    reply[i] = redis.call('HGETALL', KEYS[i])
  else
    reply[i] = redis.call('GET', KEYS[i]) or ''
  end
end
return reply
