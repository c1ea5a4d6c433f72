-- Shared by decide.lua, progress.lua, reward.lua and fold.lua: store.py puts this
-- chunk in front of each (a function library defines it once).
--
-- The records of an outcomes string (outcomes.lua's format: '<length>:<payload>'
-- each) after its first `skip`, and how many it skipped (all it has, if fewer):
-- what a worker that holds the first `skip` lacks, so that catching up costs in
-- proportion to the outcomes missed, not to all those not yet folded.
local function records_after(outcomes, skip)
  local at, skipped = 1, 0
  while skipped < skip and at <= #outcomes do
    local colon = string.find(outcomes, ':', at, true)
    at = colon + 1 + tonumber(string.sub(outcomes, at, colon - 1))
    skipped = skipped + 1
  end
  return string.sub(outcomes, at), skipped
end

-- The folds keep the records they took, the last fold's and as many whole earlier
-- folds' as fit in TAIL_BYTES, in the stats hash's field FOLDED_TAIL: '<folded> <count>
-- <sizes>\n' then the records, the last of them outcome number <folded>; <sizes> is
-- each fold's '<records>/<bytes>', oldest first (fold.lua drops the oldest whole). A
-- worker whose statistics folds overtook by fewer outcomes than that (a lag that
-- max_stale_rewards allows, or a worker that a busy other one outran) then still
-- catches up by those outcomes, not by reading every blob (the bulk of the statistics).
local FOLDED_TAIL = 'folded_tail'
local TAIL_BYTES = 32768

-- The folded tail's end, count, records and folds ({records, bytes} each, oldest first;
-- one for a tail an earlier version wrote, '<folded> <count>'); nil when there is none.
local function folded_tail(stats_key)
  local tail = redis.call('HGET', stats_key, FOLDED_TAIL)
  if not tail then
    return nil
  end
  local newline = string.find(tail, '\n', 1, true)
  local header = string.sub(tail, 1, (newline or 1) - 1)
  local ends, count = string.match(header, '^(%d+) (%d+)$')
  local sizes = ''
  if not ends then
    ends, count, sizes = string.match(header, '^(%d+) (%d+) (%d[%d/,]*)$')
  end
  if not (newline and ends) then  -- damaged: as if there were none (a fold writes it anew)
    return nil
  end
  local records = string.sub(tail, newline + 1)
  local folds, counted, bytes = {}, 0, 0
  for n, size in string.gmatch(sizes, '(%d+)/(%d+)') do
    folds[#folds + 1] = {tonumber(n), tonumber(size)}
    counted, bytes = counted + tonumber(n), bytes + tonumber(size)
    if tonumber(n) == 0 or tonumber(size) == 0 then
      return nil  -- no fold writes an empty one: damaged
    end
  end
  if #folds == 0 then  -- an earlier version's: one fold
    folds[1] = {tonumber(count), #records}
  elseif counted ~= tonumber(count) or bytes ~= #records then
    return nil  -- the sizes do not add up: damaged
  end
  return tonumber(ends), tonumber(count), records, folds
end

-- What a worker whose statistics hold the first `held` outcomes lacks, the sums
-- holding the first `folded` and `outcomes` the records after them: the records
-- after its own (from the folded tail when a fold took some of them), the count
-- `based` they are given from, and how many of those after `based` they leave out
-- (based + skipped = held, or all there are); nil when a fold took records it
-- lacks that the tail no longer has.
local function lacked(stats_key, outcomes, held, folded)
  if held >= folded then
    local records, skipped = records_after(outcomes, held - folded)
    return records, folded, skipped
  end
  local ends, count, tail = folded_tail(stats_key)
  if ends ~= folded or held < ends - count then
    return nil
  end
  return records_after(tail, held - (ends - count)) .. outcomes, held, 0
end
