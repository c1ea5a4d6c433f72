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
-- The records folded join the folded tail (tail.lua; store.py puts it in front of
-- this script): a worker some outcomes behind the folds catches up from it.
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
-- The records folded join the folded tail (tail.lua) in a field of their own, after the
-- earlier folds' that still fit in TAIL_BYTES and TAIL_FOLDS (whole folds, the oldest
-- dropped first); a tail that does not end where these records begin (none, an earlier
-- version's, damaged) starts anew, every slot an earlier fold may have left dropped.
local took = redis.call('GETRANGE', KEYS[3], 0, cut - 1)
local now_folded = tonumber(folded) + tonumber(ARGV[3])
local count, slot, sizes, dropped = tonumber(ARGV[3]), 0, {}, {}
local ends, _, folds = folded_tail(KEYS[2])
if ends == tonumber(folded) then  -- the tail ends where these records begin
  slot = (folds[#folds][1] + 1) % TAIL_FOLDS
  local first, bytes = #folds + 1, #took
  while first > 1 and #folds - first + 3 <= TAIL_FOLDS
      and bytes + folds[first - 1][3] <= TAIL_BYTES do
    first = first - 1
    bytes = bytes + folds[first][3]
  end
  for i = 1, #folds do
    if i < first then
      dropped[#dropped + 1] = tail_field(folds[i][1])
    else
      count = count + folds[i][2]
      sizes[#sizes + 1] = folds[i][1] .. ':' .. folds[i][2] .. '/' .. folds[i][3]
    end
  end
else
  for i = 1, TAIL_FOLDS - 1 do  -- (slot 0 is written below)
    dropped[i] = tail_field(i)
  end
end
if #dropped > 0 then
  redis.call('HDEL', KEYS[2], unpack(dropped))
end
sizes[#sizes + 1] = slot .. ':' .. ARGV[3] .. '/' .. #took
redis.call('HSET', KEYS[2], 'folded', now_folded,
           FOLDED_TAIL, string.format('%d %d ', now_folded, count) .. table.concat(sizes, ','),
           tail_field(slot), took, unpack(ARGV, 5))
redis.call('SET', KEYS[3], redis.call('GETRANGE', KEYS[3], cut, -1))
return 1
