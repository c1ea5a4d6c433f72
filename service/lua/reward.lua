-- Apply a batch of rewards, each exactly once, computing the additions here.
--
-- KEYS[1]  meta hash      lrb:{exp}:meta   (incarnation, key_hash, model_recipe, arm_recipe)
-- KEYS[2]  stats hash     lrb:{exp}:stats  (packed float64 sums, counters)
-- KEYS[3..]  decision hashes lrb:{exp}:decision:<id>, one per reward
-- ARGV[1]  SHA-256 (hex) of the caller's API key; '' for a trusted in-process
--          caller (a key from HTTP always hashes to 64 hex digits)
-- ARGV[2..]  one reward per decision key, as the shortest decimal that
--            round-trips the float64
--
-- Returns {'missing'} when the experiment does not exist, {'forbidden'} when
-- the key is not its key, else one status per decision: 'applied',
-- 'duplicate' (the same reward was already applied: a safe retry), 'conflict'
-- (a different reward was applied) or 'not_found'.
--
-- The decision's arm and context come from its record, never from the client.
-- What an observation does to each field is the recipe stored with the
-- experiment (see policies.state.layout and service.codec): add the upper
-- triangle of x x' ('outer_upper', row by row), r x ('r_x') or 1 ('one');
-- hold the blob's first reward c ('first_r', set while the blob's count is
-- 0); add r - c ('dr') or (r - c)^2 ('dr2'). These are the same IEEE
-- operations as policies.update, so the sums are bit-identical.
-- The marker and the additions happen in one script, so a client retry after
-- a lost reply sees 'rewarded' and cannot count the reward twice.

local meta = redis.call('HMGET', KEYS[1], 'incarnation', 'key_hash', 'model_recipe', 'arm_recipe')
if not meta[1] then
  return {'missing'}
end
if ARGV[1] ~= '' and meta[2] ~= ARGV[1] then
  return {'forbidden'}
end
if not meta[3] or not meta[4] then
  return redis.error_reply('experiment stored by an earlier version: restart the service to upgrade it')
end
local incarnation = meta[1]
local KNOWN = {outer_upper = true, r_x = true, one = true, first_r = true, dr = true, dr2 = true}
local recipes = {}
for i, text in ipairs({meta[3], meta[4]}) do
  recipes[i] = {}
  for kind in string.gmatch(text, '[^,]+') do
    if not KNOWN[kind] then
      return redis.error_reply('unknown addition ' .. kind .. ' in the experiment recipe')
    end
    recipes[i][#recipes[i] + 1] = kind
  end
end

local CHUNK = 4000  -- doubles per struct call: below Lua's C stack limit of 8000
local FORMATS = {}  -- '<ddd...' by count

local function format(m)
  local fmt = FORMATS[m]
  if not fmt then
    fmt = '<' .. string.rep('d', m)
    FORMATS[m] = fmt
  end
  return fmt
end

-- The doubles of a blob, as one table; a missing blob is n zeros.
local function unpack_doubles(blob, n)
  if not blob then
    local zeros = {}
    for j = 1, n do
      zeros[j] = 0.0
    end
    return zeros
  end
  n = #blob / 8
  if n <= CHUNK then
    local values = {struct.unpack(format(n), blob)}
    values[n + 1] = nil  -- struct.unpack also returns the position after the last value
    return values
  end
  local out = {}
  for start = 0, n - 1, CHUNK do
    local m = math.min(CHUNK, n - start)
    local values = {struct.unpack(format(m), blob, start * 8 + 1)}
    for j = 1, m do
      out[start + j] = values[j]
    end
  end
  return out
end

local function pack_doubles(values)
  local parts = {}
  for start = 0, #values - 1, CHUNK do
    local m = math.min(CHUNK, #values - start)
    parts[#parts + 1] = struct.pack(format(m), unpack(values, start + 1, start + m))
  end
  return table.concat(parts)
end

-- Add one observation (context x, reward r) to the sums v in place, field by
-- field as the recipe says: the same products and sums as policies.update.
-- The recipe holds the count ('one') before the shift ('first_r') and the
-- shift before the shifted sums (policies.state.layout's order).
local function add_observation(v, recipe, x, r)
  local p, d = 0, #x
  local fresh, first = false, 0.0
  for _, kind in ipairs(recipe) do
    if kind == 'outer_upper' then  -- x x', its upper triangle row by row
      for i = 1, d do
        local xi = x[i]
        for j = i, d do
          p = p + 1
          v[p] = v[p] + xi * x[j]
        end
      end
    elseif kind == 'r_x' then
      for i = 1, d do
        p = p + 1
        v[p] = v[p] + r * x[i]
      end
    elseif kind == 'one' then
      p = p + 1
      fresh = v[p] == 0.0
      v[p] = v[p] + 1.0
    elseif kind == 'first_r' then
      p = p + 1
      if fresh then
        v[p] = r
      end
      first = v[p]
    elseif kind == 'dr' then
      p = p + 1
      v[p] = v[p] + (r - first)
    else  -- 'dr2'
      p = p + 1
      local deviation = r - first
      v[p] = v[p] + deviation * deviation
    end
  end
end

-- The context is kept in chunks of at most 64 bytes ('x:1', 'x:2', ...), so
-- Redis keeps the decision hash in its compact encoding; the first eight
-- chunks (d <= 64) come with the other fields in one HMGET. A decision of an
-- earlier version has the context whole in 'x'.
local FIRST_CHUNKS = 8
local DECISION_FIELDS = {'status', 'incarnation', 'reward', 'x', 'model_field', 'arm_field',
                         'x_chunks'}
for i = 1, FIRST_CHUNKS do
  DECISION_FIELDS[#DECISION_FIELDS + 1] = 'x:' .. i
end

-- status, incarnation, reward, x (packed float64), model field, arm field.
local function read_decision(key)
  local decision = redis.call('HMGET', key, unpack(DECISION_FIELDS))
  local chunks = tonumber(decision[7])
  if not decision[4] and chunks then
    local parts = {}
    for i = 1, math.min(chunks, FIRST_CHUNKS) do
      parts[i] = decision[7 + i]
    end
    if chunks > FIRST_CHUNKS then
      local names = {}
      for i = FIRST_CHUNKS + 1, chunks do
        names[#names + 1] = 'x:' .. i
      end
      for _, part in ipairs(redis.call('HMGET', key, unpack(names))) do
        parts[#parts + 1] = part
      end
    end
    decision[4] = table.concat(parts)
  end
  return decision
end

local function blob_length(recipe, d)
  local n = 0
  for _, kind in ipairs(recipe) do
    if kind == 'outer_upper' then n = n + d * (d + 1) / 2
    elseif kind == 'r_x' then n = n + d
    else n = n + 1 end
  end
  return 8 * n
end

-- The decision's two sums as stored (nil when nothing was observed yet), or
-- an error when their sizes do not match the recipe.
local function read_sums(decision)
  local blobs = redis.call('HMGET', KEYS[2], decision[5], decision[6])
  local d = #decision[4] / 8
  for i = 1, 2 do
    local blob = blobs[i]
    if blob and #blob ~= blob_length(recipes[i], d) then
      return nil, redis.error_reply('stored statistics do not match field ' .. decision[4 + i])
    end
  end
  return blobs, nil
end

-- A batch is checked whole before anything is written, so a store that does
-- not match its recipe refuses it whole. (A single reward is checked by
-- apply before it writes.)
if #KEYS > 3 then
  for k = 3, #KEYS do
    local decision = read_decision(KEYS[k])
    if decision[1] == 'pending' and decision[2] == incarnation then
      local _, refused = read_sums(decision)
      if refused then
        return refused
      end
    end
  end
end

-- Add the reward to the decision's model and arm sums; an error, before any
-- write, when the stored sums do not match the recipe.
local function apply(decision, text)
  local blobs, refused = read_sums(decision)
  if refused then
    return refused
  end
  local x = unpack_doubles(decision[4])
  local r = tonumber(text)
  local packed = {}
  for i = 1, 2 do
    local sums = unpack_doubles(blobs[i], blob_length(recipes[i], #x) / 8)
    add_observation(sums, recipes[i], x, r)
    packed[i] = pack_doubles(sums)
  end
  redis.call('HSET', KEYS[2], decision[5], packed[1], decision[6], packed[2])
  return nil
end

local statuses = {}
for k = 3, #KEYS do
  local reward = ARGV[k - 1]
  local decision = read_decision(KEYS[k])
  -- A decision made before its experiment was deleted (and perhaps created
  -- again under the same id) belongs to no current experiment.
  if not decision[1] or decision[2] ~= incarnation then
    statuses[#statuses + 1] = 'not_found'
  elseif decision[1] == 'rewarded' then
    if decision[3] == reward then
      redis.call('HINCRBY', KEYS[2], 'duplicates', 1)
      statuses[#statuses + 1] = 'duplicate'
    else
      statuses[#statuses + 1] = 'conflict'
    end
  else
    local refused = apply(decision, reward)
    if refused then
      return refused
    end
    redis.call('HSET', KEYS[k], 'status', 'rewarded', 'reward', reward)
    redis.call('HINCRBY', KEYS[2], 'rewards', 1)
    statuses[#statuses + 1] = 'applied'
  end
end
return statuses
