-- Shared by decide.lua, reward.lua and settle.lua (store.py puts this chunk in
-- front of each; a function library defines it once).
--
-- What happened minute by minute, over the last hour, for GET /experiments/{id}
-- and /ui. The stats hash's counters decisions, rewards and defaulted count
-- everything; a minute's share of them is marked once, by the minute's first call
-- that counts: the field RECENT_MARKS holds 60 slots of 28 bytes, slot m % 60 for
-- minute m (Redis's clock in seconds / 60): m, a little-endian unsigned 32-bit
-- integer, then the three counters as they were just before that call, each a
-- little-endian float64 (exact to 2^53). A minute's counts are the counters of the
-- next mark made (in the counters' order: the order the marks were made in, should
-- the clock step back) less its own, the last mark's the counters now
-- (service.lifecycle.recent_minutes). RECENT_MINUTE holds the minute last marked:
-- decide.lua and reward.lua read it with the counters they read anyway (settle.lua,
-- which reads no counters, with one HMGET when it applies defaults), so a call pays
-- next to nothing for the minutes unless its minute is a new one. A mark of a minute
-- marked before (the clock set back onto it) replaces that mark: the counts still add
-- up, the earlier activity counted in the minute marked before it.
-- (An earlier version counted every call into a 960-byte field, read and written
-- whole each time: 3-4 µs of every decision and reward; its field RECENT_OLD is
-- dropped at the first mark.)
local RECENT_SLOT, RECENT_SLOTS = 28, 60
local RECENT_MARKS, RECENT_MINUTE, RECENT_OLD = 'recent_marks', 'recent_minute', 'recent'
local function mark_minute(stats_key, now, marked, decisions, rewards, defaulted)
  local minute = math.floor(now / 60)
  if tonumber(marked) == minute then
    return
  end
  local ring = redis.call('HGET', stats_key, RECENT_MARKS) or ''
  if #ring ~= RECENT_SLOTS * RECENT_SLOT then  -- (the first mark, or a damaged field)
    ring = string.rep('\0', RECENT_SLOTS * RECENT_SLOT)
  end
  local at = (minute % RECENT_SLOTS) * RECENT_SLOT
  local mark = struct.pack('<I4ddd', minute, tonumber(decisions or '0'),
                           tonumber(rewards or '0'), tonumber(defaulted or '0'))
  redis.call('HSET', stats_key, RECENT_MARKS, string.sub(ring, 1, at) .. mark
             .. string.sub(ring, at + RECENT_SLOT + 1), RECENT_MINUTE, minute)
  -- Earlier versions' counts: the ring, and this minute's of the fields before it (all
  -- gone after an hour of marks).
  local slot = minute % RECENT_SLOTS
  redis.call('HDEL', stats_key, RECENT_OLD, 'recent:d:' .. slot, 'recent:r:' .. slot,
             'recent:f:' .. slot)
end
