-- Shared by decide.lua, progress.lua and reward.lua: store.py puts this chunk
-- in front of each (a function library defines it once).
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

