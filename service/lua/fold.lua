-- Write sums back with the outcomes they now hold, if no other fold came
-- between (several workers may fold the same outcomes: one wins).
--
-- KEYS[1]  meta hash   lrb:{exp}:meta
-- KEYS[2]  stats hash  lrb:{exp}:stats  (packed sums; counter folded; outcomes 'u:<n>')
-- ARGV[1]  the incarnation fold_read.lua saw
-- ARGV[2]  the folded counter it saw
-- ARGV[3]  k: the sums now hold outcomes folded + 1 .. folded + k
-- ARGV[4..]  field, blob, ...: the sums those outcomes add to, with them added
--
-- Returns 1 when written, 0 when the experiment is another incarnation or
-- another fold came first (nothing written). Only this script removes
-- outcomes, and it counts them in 'folded': an unchanged counter means that
-- the outcomes are still those fold_read.lua returned.

if redis.call('HGET', KEYS[1], 'incarnation') ~= ARGV[1] then
  return 0
end
local folded = tonumber(redis.call('HGET', KEYS[2], 'folded') or '0')
if folded ~= tonumber(ARGV[2]) then
  return 0
end
local k = tonumber(ARGV[3])
local names = {}
for n = folded + 1, folded + k do
  names[#names + 1] = 'u:' .. n
end
redis.call('HDEL', KEYS[2], unpack(names))
redis.call('HSET', KEYS[2], 'folded', folded + k, unpack(ARGV, 4))
return 1
