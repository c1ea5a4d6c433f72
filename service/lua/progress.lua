-- What a worker whose view is current but for the latest outcomes needs to
-- catch up, without the sums (the stats hash's blobs: the bulk of a read).
--
-- KEYS[1]  meta hash   lrb:{exp}:meta     (incarnation, version)
-- KEYS[2]  stats hash  lrb:{exp}:stats    (counters rewards, defaulted, decision_seq, folded)
-- KEYS[3]  outcomes    lrb:{exp}:outcomes (records not yet in the sums: outcomes.lua)
-- ARGV[1]  (optional) how many outcomes the caller's statistics hold: the records
--          it holds are left out (store.py puts tail.lua in front of this script)
--
-- Returns {} when the experiment does not exist, else {incarnation, version,
-- outcomes counter (rewards + defaulted), decision_seq, based, outcomes,
-- skipped}, read together: the records after outcome number `based` (the
-- folded count, or with ARGV[1] what the caller lacks: tail.lua's lacked())
-- after their first `skipped`. It writes nothing.

local meta = redis.call('HMGET', KEYS[1], 'incarnation', 'version')
if not meta[1] then
  return {}
end
local counters = redis.call('HMGET', KEYS[2], 'rewards', 'decision_seq', 'folded', 'defaulted')
local outcomes = tonumber(counters[1] or '0') + tonumber(counters[4] or '0')
local records, based, skipped = redis.call('GET', KEYS[3]) or '', tonumber(counters[3] or '0'), 0
local held = tonumber(ARGV[1] or '')
if held then
  local lacking, from, left_out = lacked(KEYS[2], records, held, based)
  if lacking then
    records, based, skipped = lacking, from, left_out
  end
end
return {meta[1], meta[2], tostring(outcomes), counters[2] or '0', string.format('%d', based),
        records, skipped}
