-- Apply one reward exactly once.
--
-- KEYS[1]  decision hash   lrb:{exp}:decision:<id>  (status, reward, ...)
-- KEYS[2]  stats hash      lrb:{exp}:stats          (packed float64 sums, counters)
-- KEYS[3]  meta hash       lrb:{exp}:meta           (must exist, same incarnation)
-- ARGV[1]  reward, as the shortest decimal that round-trips the float64
-- ARGV[2]  number n of (field, delta) pairs that follow
-- ARGV[3..2+2n]  field name, little-endian float64 delta blob, ...
--
-- Returns 'applied', 'duplicate' (same reward already applied: a safe retry),
-- 'conflict' (a different reward was applied) or 'not_found'.
--
-- The marker and the additions happen in one script, so a client retry after a
-- lost reply sees 'rewarded' and cannot count the reward twice.

local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return 'not_found'
end
-- A decision made before its experiment was deleted (and perhaps created
-- again under the same id) belongs to no current experiment.
local incarnation = redis.call('HGET', KEYS[3], 'incarnation')
if not incarnation or incarnation ~= redis.call('HGET', KEYS[1], 'incarnation') then
  return 'not_found'
end
if status == 'rewarded' then
  if redis.call('HGET', KEYS[1], 'reward') == ARGV[1] then
    redis.call('HINCRBY', KEYS[2], 'duplicates', 1)
    return 'duplicate'
  end
  return 'conflict'
end

local CHUNK = 200  -- doubles per struct call: stays far below Lua's C stack limit

local function add_blob(field, delta)
  local current = redis.call('HGET', KEYS[2], field)
  if not current then
    redis.call('HSET', KEYS[2], field, delta)
    return
  end
  if #current ~= #delta then
    return redis.error_reply('size mismatch for field ' .. field)
  end
  local n = #delta / 8
  local out = {}
  for start = 0, n - 1, CHUNK do
    local m = math.min(CHUNK, n - start)
    local fmt = '<' .. string.rep('d', m)
    local a = {struct.unpack(fmt, current, start * 8 + 1)}
    local b = {struct.unpack(fmt, delta, start * 8 + 1)}
    for j = 1, m do
      a[j] = a[j] + b[j]
    end
    out[#out + 1] = struct.pack(fmt, unpack(a, 1, m))
  end
  redis.call('HSET', KEYS[2], field, table.concat(out))
end

-- Check every blob before writing any, so a bad call changes nothing.
local n = tonumber(ARGV[2])
for i = 0, n - 1 do
  local field, delta = ARGV[3 + 2 * i], ARGV[4 + 2 * i]
  local current = redis.call('HGET', KEYS[2], field)
  if current and #current ~= #delta then
    return redis.error_reply('size mismatch for field ' .. field)
  end
end
for i = 0, n - 1 do
  add_blob(ARGV[3 + 2 * i], ARGV[4 + 2 * i])
end
redis.call('HSET', KEYS[1], 'status', 'rewarded', 'reward', ARGV[1])
redis.call('HINCRBY', KEYS[2], 'rewards', 1)
return 'applied'
