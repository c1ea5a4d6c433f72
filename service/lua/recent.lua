-- Shared by decide.lua, reward.lua and settle.lua (store.py puts this chunk in
-- front of each; a function library defines it once).
--
-- What happened minute by minute, over the last hour, for GET /experiments/{id}
-- and /ui: the stats hash's field 'recent:<kind>:<m % 60>' (kind d: decisions,
-- r: rewards, f: default rewards) holds m * 1e8 + the count of minute m (Redis's
-- clock in seconds / 60; below 2^53 for millennia), begun afresh when its field
-- comes round again an hour later. One HINCRBY a call, and an HSET the first time
-- a field comes round (service.lifecycle.recent_minutes reads them).
local RECENT_SCALE = 100000000
local function count_recent(stats_key, now, kind, count)
  local minute = math.floor(now / 60)
  local field = 'recent:' .. kind .. ':' .. (minute % 60)
  local value = redis.call('HINCRBY', stats_key, field, count)
  if math.floor(value / RECENT_SCALE) ~= minute then  -- an hour old, or more
    redis.call('HSET', stats_key, field, string.format('%.0f', minute * RECENT_SCALE + count))
  end
end
