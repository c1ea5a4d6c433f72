-- Shared by reward.lua and settle.lua: store.py puts this chunk in front of
-- each, so a reward and a default reward are added by the same code.
--
-- What an observation does to each field is the recipe stored with the
-- experiment (see policies.state.layout and service.codec): add the upper
-- triangle of x x' ('outer_upper', row by row), r x ('r_x') or 1 ('one');
-- hold the blob's first reward c ('first_r', set while the blob's count is
-- 0); add r - c ('dr') or (r - c)^2 ('dr2'). These are the same IEEE
-- operations as policies.update, so the sums are bit-identical. An
-- experiment that forgets (meta 'discount' gamma < 1) has a clock first in
-- each blob ('at') and an undiscounted count in the arm's ('tally'); see
-- add_discounted.
--
-- Only local functions: Redis forbids a script to create globals.

-- The recipes service.codec writes today, split: splitting a recipe cost a
-- tenth of a single reward, and a script keeps nothing from one call to the
-- next (comparing interned strings is nearly free). Any other recipe (an
-- experiment of an earlier version) is split by split_recipe; both give the
-- same list (tests/test_store_batching.py checks these against the codec).
local function split_common(text)
  if text == 'outer_upper,r_x,one,first_r,dr,dr2' then
    return {'outer_upper', 'r_x', 'one', 'first_r', 'dr', 'dr2'}
  elseif text == 'one,first_r,dr,dr2' then
    return {'one', 'first_r', 'dr', 'dr2'}
  elseif text == 'one,first_r,dr,dr2,outer_upper,r_x' then
    return {'one', 'first_r', 'dr', 'dr2', 'outer_upper', 'r_x'}
  elseif text == 'at,outer_upper,r_x,one,first_r,dr,dr2' then
    return {'at', 'outer_upper', 'r_x', 'one', 'first_r', 'dr', 'dr2'}
  elseif text == 'at,one,first_r,dr,dr2,tally' then
    return {'at', 'one', 'first_r', 'dr', 'dr2', 'tally'}
  elseif text == 'at,one,first_r,dr,dr2,outer_upper,r_x,tally' then
    return {'at', 'one', 'first_r', 'dr', 'dr2', 'outer_upper', 'r_x', 'tally'}
  end
  return nil
end

-- A recipe's additions, or nil and an error reply.
local function split_recipe(text)
  local recipe = split_common(text)
  if recipe then
    return recipe, nil
  end
  local known = {outer_upper = true, r_x = true, one = true, first_r = true, dr = true, dr2 = true,
                 at = true, tally = true}
  recipe = {}
  for kind in string.gmatch(text, '[^,]+') do
    if not known[kind] then
      return nil, redis.error_reply('unknown addition ' .. kind .. ' in the experiment recipe')
    end
    recipe[#recipe + 1] = kind
  end
  return recipe, nil
end

-- The model and arm recipes (comma-separated additions), or nil and an error
-- reply. An experiment that forgets has a clock ('at') first in each recipe
-- and its gamma (the meta's 'discount') in recipes.discount.
local function parse_recipes(model_text, arm_text, discount)
  if not model_text or not arm_text then
    return nil, redis.error_reply(
      'experiment stored by an earlier version: restart the service to upgrade it')
  end
  local model, refused = split_recipe(model_text)
  if refused then
    return nil, refused
  end
  local arm, refused_arm = split_recipe(arm_text)
  if refused_arm then
    return nil, refused_arm
  end
  if (model[1] == 'at') ~= (arm[1] == 'at') or (model[1] == 'at') ~= (tonumber(discount) ~= nil) then
    return nil, redis.error_reply('the experiment recipe and discount do not agree')
  end
  return {model, arm, discount = tonumber(discount)}, nil
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

-- base ^ k for a whole k >= 0 by repeated squaring: the result times
-- base ^ (2 ^ i) for each set bit i, lowest first, as policies.state.power
-- multiplies (math.pow may round differently from NumPy).
local function power(base, k)
  local result = 1.0
  while k > 0 do
    if k % 2 == 1 then
      result = result * base
    end
    k = (k - k % 2) / 2
    base = base * base
  end
  return result
end

-- As add_observation, for an experiment that forgets (policies.state,
-- "Forgetting"): the blob's clock ('at', first in the recipe) goes to
-- now = max(at, number); every sum is multiplied by gamma ^ (now - at) and
-- the observation added with weight gamma ^ (now - number). The shift and
-- the undiscounted count ('tally') do not decay. The same operations, in the
-- same order, as policies.state._add_discounted.
local function add_discounted(v, recipe, x, r, number, gamma)
  local p, d = 0, #x
  local decay, weight = 1.0, 1.0
  local fresh, first = false, 0.0
  for _, kind in ipairs(recipe) do
    p = p + 1
    if kind == 'at' then
      local now = math.max(v[p], number)
      decay, weight = power(gamma, now - v[p]), power(gamma, now - number)
      v[p] = now
    elseif kind == 'outer_upper' then
      p = p - 1
      for i = 1, d do
        local xi = x[i]
        for j = i, d do
          p = p + 1
          v[p] = v[p] * decay + weight * (xi * x[j])
        end
      end
    elseif kind == 'r_x' then
      p = p - 1
      for i = 1, d do
        p = p + 1
        v[p] = v[p] * decay + weight * (r * x[i])
      end
    elseif kind == 'one' then
      local kept = v[p] * decay
      fresh = kept == 0.0
      v[p] = kept + weight
    elseif kind == 'first_r' then
      if fresh then
        v[p] = r
      end
      first = v[p]
    elseif kind == 'dr' then
      v[p] = v[p] * decay + weight * (r - first)
    elseif kind == 'dr2' then
      local deviation = r - first
      v[p] = v[p] * decay + weight * (deviation * deviation)
    else  -- 'tally'
      v[p] = v[p] + 1.0
    end
  end
end

-- A decision as read_decision returns it: these positions (false when absent).
local STATUS, INCARNATION, MODEL_FIELD, ARM_FIELD, X_CHUNKS, DEADLINE = 1, 2, 3, 4, 5, 6
local FIRST_CHUNKS, CHUNK_AT = 4, 7  -- x:1 .. x:4 at positions 7 .. 10: d <= 32 in one HMGET
local NUMBER, X, REWARD = 11, 12, 13

-- The context is kept in chunks of at most 64 bytes ('x:1', 'x:2', ...), so
-- Redis keeps the decision hash in its compact encoding; a decision of an
-- earlier version has it whole in 'x'. 'deadline' (the end of the reward
-- window) is there when the experiment has a default reward.
--
-- Every field asked for costs Redis a search of the decision's hash (an
-- absent one, the whole hash), and most of a reward's reads were of fields it
-- did not need: the first HMGET asks for what a reward reads, its number only
-- when `numbered` (an experiment that forgets), and the first four chunks;
-- the context whole (X) is read only for a pending decision without chunks,
-- the reward a decision got (REWARD) only by reward_of. X is the context joined.
local function read_decision(key, numbered)
  local fields = {'status', 'incarnation', 'model_field', 'arm_field', 'x_chunks', 'deadline',
                  'x:1', 'x:2', 'x:3', 'x:4'}
  fields[NUMBER] = numbered and 'number' or nil
  local decision = redis.call('HMGET', key, unpack(fields))
  local chunks = tonumber(decision[X_CHUNKS])
  if not chunks then  -- an earlier version's decision, or none (a settled one has no context)
    decision[X] = decision[STATUS] == 'pending' and redis.call('HGET', key, 'x')
    return decision
  end
  local last = CHUNK_AT - 1 + math.min(chunks, FIRST_CHUNKS)
  if chunks <= FIRST_CHUNKS then
    decision[X] = table.concat(decision, '', CHUNK_AT, last)
    return decision
  end
  local parts = {unpack(decision, CHUNK_AT, last)}
  local names = {}
  for i = FIRST_CHUNKS + 1, chunks do
    names[#names + 1] = 'x:' .. i
  end
  for _, part in ipairs(redis.call('HMGET', key, unpack(names))) do
    parts[#parts + 1] = part
  end
  decision[X] = table.concat(parts)
  return decision
end

-- The reward a rewarded decision got (read once, when first needed).
local function reward_of(key, decision)
  if decision[REWARD] == nil then
    decision[REWARD] = redis.call('HGET', key, 'reward')
  end
  return decision[REWARD]
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

-- The sums a call adds to, unpacked once and packed once (flush_sums, at
-- the end of the call): a batch adds many observations to the same few blobs
-- (the shared model's above all), and unpacking and packing them was most of
-- a reward's cost. Packing and unpacking float64 is exact, so the sums are
-- those of adding reward after reward, blob by blob.
local loaded = {}   -- stats field -> its doubles
local touched = {}  -- the fields added to, in the order first added to

-- Load the decision's two sums (once per call), checking their sizes against
-- the recipes; nil, or an error reply (before any write) when they do not match.
local function load_sums(stats_key, recipes, decision)
  local d = #decision[X] / 8
  local blobs = nil  -- HMGET of both fields, when one is not loaded yet
  for i = 1, 2 do
    local name, n = decision[MODEL_FIELD + i - 1], blob_length(recipes[i], d)
    local sums = loaded[name]
    if not sums then
      blobs = blobs or redis.call('HMGET', stats_key, decision[MODEL_FIELD], decision[ARM_FIELD])
      if blobs[i] and #blobs[i] ~= n then
        return redis.error_reply('stored statistics do not match field ' .. name)
      end
      loaded[name] = unpack_doubles(blobs[i], n / 8)
    elseif #sums * 8 ~= n then  -- loaded for a decision whose context had another size
      return redis.error_reply('stored statistics do not match field ' .. name)
    end
  end
  if recipes.discount and not tonumber(decision[NUMBER]) then
    return redis.error_reply('a decision without a number in an experiment that forgets')
  end
  return nil
end

-- Add the reward (its text) to the decision's model and arm sums, as loaded;
-- an error, before any write, when the stored sums do not match the recipes.
local function apply(stats_key, recipes, decision, text)
  local refused = load_sums(stats_key, recipes, decision)
  if refused then
    return refused
  end
  local gamma, number = recipes.discount, tonumber(decision[NUMBER])
  local x = unpack_doubles(decision[X])
  local r = tonumber(text)
  for i = 1, 2 do
    local name = decision[MODEL_FIELD + i - 1]
    local sums = loaded[name]
    if gamma then
      add_discounted(sums, recipes[i], x, r, number, gamma)
    else
      add_observation(sums, recipes[i], x, r)
    end
    if not touched[name] then
      touched[name] = true
      touched[#touched + 1] = name
    end
  end
  return nil
end

-- Write the sums added to back to the stats hash, in one HSET.
local function flush_sums(stats_key)
  if #touched == 0 then
    return
  end
  local pairs_ = {}
  for _, name in ipairs(touched) do
    pairs_[#pairs_ + 1] = name
    pairs_[#pairs_ + 1] = pack_doubles(loaded[name])
  end
  redis.call('HSET', stats_key, unpack(pairs_))
end

-- The decision's id: what follows ':decision:' in its key.
local function decision_id(key)
  return string.match(key, ':decision:(.*)$')
end

-- Append an outcome to the experiment's decision log (meta's log_max_entries
-- and log_max_age_seconds; no log when the first is absent or 0). The log
-- keeps its key while entries arrive: it expires max_age after the last one
-- (set once per call, by finish).
local log_written = nil  -- {key, max_age} once an outcome is logged in this call
local function log_outcome(log_key, max_entries, max_age, kind, id, reward)
  if not max_entries or tonumber(max_entries) <= 0 then
    return
  end
  redis.call('XADD', log_key, 'MAXLEN', '~', max_entries, '*',
             'type', kind, 'id', id, 'reward', reward)
  log_written = {log_key, max_age}
end

-- The end of a call that added or logged outcomes: the sums added to are
-- written back, and the log expires max_age after its last entry.
local function finish(stats_key)
  flush_sums(stats_key)
  if log_written then
    redis.call('EXPIRE', log_written[1], log_written[2])
  end
end
