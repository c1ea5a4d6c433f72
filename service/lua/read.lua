-- Read hashes of one experiment together: a consistent snapshot in one round trip.
--
-- A script, not MULTI/EXEC: redis-py's asyncio cluster client sends scripts
-- as it sends any command, while its transactions fail on HGETALL. It writes
-- nothing.
--
-- KEYS[1..n]  hashes sharing one hash tag (lrb:{exp}:meta, :arms, :stats)
--
-- Returns {HGETALL KEYS[1], ..., HGETALL KEYS[n]}: a flat field, value list per
-- hash (empty for a hash that does not exist).

local reply = {}
for i = 1, #KEYS do
  reply[i] = redis.call('HGETALL', KEYS[i])
end
return reply
