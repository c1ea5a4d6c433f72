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

-- When outcomes came, so that a decision made while they did may go before them
-- (decide.lua): the stats hash's field 'applied' holds 64 slots of 24 bytes, one
-- per script call that applied outcomes (slot first % 64): the numbers of its first
-- and last outcomes (rewards and default rewards counted together) and Redis's clock
-- then, in microseconds, each a little-endian double (exact below 2^53). A slot is
-- taken over by a later call; a number no slot holds has no known time.
local APPLIED_SLOT, APPLIED_SLOTS = 24, 64
local function microseconds()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000000 + tonumber(time[2])
end
local function stamp_applied(stats_key, first, last)
  local ring = redis.call('HGET', stats_key, 'applied') or ''
  if #ring ~= APPLIED_SLOTS * APPLIED_SLOT then  -- (the first stamp, or a damaged field)
    ring = string.rep('\0', APPLIED_SLOTS * APPLIED_SLOT)
  end
  local at = (first % APPLIED_SLOTS) * APPLIED_SLOT
  redis.call('HSET', stats_key, 'applied', string.sub(ring, 1, at)
             .. struct.pack('<ddd', first, last, microseconds())
             .. string.sub(ring, at + APPLIED_SLOT + 1))
end
-- When outcome `number` came, and Redis's clock now (microseconds); nil when no slot
-- holds it, or when a slot's time is later than now (the clock stepped back, or
-- another host wrote it before a failover): times that cannot be compared.
local function applied_at(stats_key, number)
  local ring = redis.call('HGET', stats_key, 'applied')
  if not ring or #ring ~= APPLIED_SLOTS * APPLIED_SLOT then
    return nil
  end
  local now, found = microseconds(), nil
  for at = 1, #ring, APPLIED_SLOT do
    local first, last, time = struct.unpack('<ddd', ring, at)
    if time > now then
      return nil
    end
    if first <= number and number <= last then
      found = time
    end
  end
  return found, now
end
