-- Record a pending decision and count it, once.
--
-- KEYS[1]  decision hash  lrb:{exp}:decision:<id>
-- KEYS[2]  stats hash     lrb:{exp}:stats
-- KEYS[3]  meta hash      lrb:{exp}:meta
-- ARGV[1]  time to live in seconds (the reward window)
-- ARGV[2]  the experiment incarnation the decision was made in
-- ARGV[3..]  field, value, ... of the decision
--
-- Returns 1 when recorded, 0 when this decision was already recorded (the
-- client resent the script after a lost reply: nothing is counted twice),
-- -1 when the experiment no longer exists (or was deleted and created again).

if redis.call('HGET', KEYS[3], 'incarnation') ~= ARGV[2] then
  return -1
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'incarnation', ARGV[2])
for i = 3, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
redis.call('HINCRBY', KEYS[2], 'decisions', 1)
return 1
