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
-- folds' as fit in TAIL_BYTES (at most TAIL_FOLDS folds), each fold's in a field of the
-- stats hash of its own, FOLDED_TAIL .. ':' .. <slot> (a ring of TAIL_FOLDS slots: a
-- fold takes the slot after the last one's), and the index in FOLDED_TAIL:
-- '<folded> <count> <slot>:<records>/<bytes>,...', the folds oldest first, the last
-- record outcome number <folded>. A worker whose statistics folds overtook by fewer
-- outcomes than that (a lag that max_stale_rewards allows, or a worker that a busy
-- other one outran) then still catches up by those outcomes, not by reading every blob
-- (the bulk of the statistics). One field a fold, not one field for all: rewriting a
-- 32 KB string every fold cost Redis 7 (jemalloc) 0.2 ms a fold (BENCHMARKS section 20).
local FOLDED_TAIL = 'folded_tail'
local TAIL_BYTES = 32768
local TAIL_FOLDS = 16

-- The folded tail's end, count and folds ({slot, records, bytes} each, oldest first); nil
-- when there is none, or it is an earlier version's (its records in FOLDED_TAIL after a
-- newline) or damaged: read strictly, as a wrong index would give a worker wrong records.
local function folded_tail(stats_key)
  local index = redis.call('HGET', stats_key, FOLDED_TAIL)
  local ends, count, sizes = string.match(index or '', '^(%d+) (%d+) ([%d:/,]+)$')
  if not ends then
    return nil
  end
  local folds, counted, written = {}, 0, {}
  for slot, n, size in string.gmatch(sizes, '(%d+):(%d+)/(%d+)') do
    local previous = folds[#folds]
    folds[#folds + 1] = {tonumber(slot), tonumber(n), tonumber(size)}
    counted = counted + tonumber(n)
    written[#written + 1] = slot .. ':' .. n .. '/' .. size
    if tonumber(n) == 0 or tonumber(size) == 0 or tonumber(slot) >= TAIL_FOLDS
        or (previous and tonumber(slot) ~= (previous[1] + 1) % TAIL_FOLDS) then
      return nil  -- no fold writes an empty one, a slot beyond the ring or out of turn
    end
  end
  if table.concat(written, ',') ~= sizes or counted ~= tonumber(count) then
    return nil
  end
  return tonumber(ends), counted, folds
end

-- A fold's field of the folded tail.
local function tail_field(slot)
  return FOLDED_TAIL .. ':' .. slot
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
  local ends, count, folds = folded_tail(stats_key)
  if ends ~= folded or held < ends - count then
    return nil
  end
  local start, first = ends - count, 1  -- the outcomes before the first fold read
  while start + folds[first][2] <= held do
    start, first = start + folds[first][2], first + 1
  end
  local names = {}
  for i = first, #folds do
    names[#names + 1] = tail_field(folds[i][1])
  end
  local parts = redis.call('HMGET', stats_key, unpack(names))
  for i = 1, #names do
    if not parts[i] or #parts[i] ~= folds[first + i - 1][3] then
      return nil  -- a fold's records gone or not the index's: damaged
    end
  end
  return records_after(table.concat(parts), held - start) .. outcomes, held, 0
end
