-- Shared by decide.lua, reward.lua and settle.lua (store.py puts this chunk in
-- front of each; a function library defines it once).
--
-- What happened minute by minute, over the last hour, for GET /experiments/{id}
-- and /ui: the stats hash's field 'recent' holds 60 slots of 16 bytes, slot
-- m % 60 for minute m (Redis's clock in seconds / 60): m, then the minute's
-- decisions, rewards and default rewards, each a little-endian unsigned 32-bit
-- integer; a slot is begun afresh when its minute comes round again an hour later
-- (service.lifecycle.recent_minutes reads them). One field of 960 bytes: 180 small
-- fields would have cost a stats hash 18 KB of Redis's memory.
local RECENT_SLOT, RECENT_SLOTS = 16, 60
local function count_recent(stats_key, now, kind, count)
  local minute = math.floor(now / 60)
  local at = (minute % RECENT_SLOTS) * RECENT_SLOT
  local ring = redis.call('HGET', stats_key, 'recent') or ''
  if #ring ~= RECENT_SLOTS * RECENT_SLOT then  -- (the first count, or a damaged field)
    ring = string.rep('\0', RECENT_SLOTS * RECENT_SLOT)
  end
  local m, d, r, f = struct.unpack('<I4I4I4I4', ring, at + 1)
  if m ~= minute then
    m, d, r, f = minute, 0, 0, 0
  end
  if kind == 'd' then
    d = d + count
  elseif kind == 'r' then
    r = r + count
  else
    f = f + count
  end
  redis.call('HSET', stats_key, 'recent', string.sub(ring, 1, at)
             .. struct.pack('<I4I4I4I4', m, d, r, f) .. string.sub(ring, at + RECENT_SLOT + 1))
end
