-- Write sums back with the oldest outcomes added, and cut those outcomes from
-- the outcomes string, if no other fold came between (several workers may
-- fold the same outcomes: one wins).
--
-- KEYS[1]  meta hash   lrb:{exp}:meta
-- KEYS[2]  stats hash  lrb:{exp}:stats     (packed sums; counter folded)
-- KEYS[3]  outcomes    lrb:{exp}:outcomes  (records: outcomes.lua)
-- ARGV[1]  the incarnation fold_read.lua saw
-- ARGV[2]  the folded counter it saw
-- ARGV[3]  k: the sums now hold the first k records of the outcomes string
-- ARGV[4]  their length in bytes
-- ARGV[5..]  field, blob, ...: the sums those records add to, with them added
--
-- The records folded become the folded tail (tail.lua; store.py puts it in front of
-- this script): a worker a few outcomes behind the fold catches up from it.
-- Returns 1 when written, 0 when the experiment is another incarnation or
-- another fold came first (nothing written). Within an incarnation only this
-- script removes records (from the front; the scripts that record append at
-- the end; create.lua, delete.lua and the start-up upgrade start another
-- incarnation or an experiment that had none) and it counts them in
-- 'folded', so an unchanged counter means that the string still starts with
-- the records fold_read.lua returned.

if redis.call('HGET', KEYS[1], 'incarnation') ~= ARGV[1] then
  return 0
end
local folded = redis.call('HGET', KEYS[2], 'folded') or '0'
if folded ~= ARGV[2] then
  return 0
end
local cut = tonumber(ARGV[4])
if redis.call('STRLEN', KEYS[3]) < cut then
  return redis.error_reply('fold.lua: the outcomes are shorter than the records folded')
end
-- The records folded stay as the folded tail (tail.lua) until the next fold.
local now_folded = tonumber(folded) + tonumber(ARGV[3])
redis.call('HSET', KEYS[2], 'folded', now_folded,
           FOLDED_TAIL, string.format('%d %d\n', now_folded, tonumber(ARGV[3]))
             .. redis.call('GETRANGE', KEYS[3], 0, cut - 1), unpack(ARGV, 5))
redis.call('SET', KEYS[3], redis.call('GETRANGE', KEYS[3], cut, -1))
return 1
