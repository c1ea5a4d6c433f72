-- Shared by reward.lua and settle.lua: store.py puts this chunk in front of
-- each, so a reward and a default reward are recorded by the same code.
--
-- An outcome is not added to the sums here: it is appended to the
-- experiment's outcomes string (keys.outcomes) as one record,
--   <length of the payload, decimal> ':' <payload>
-- whose payload is
--   model field '\n' arm field '\n' decision number '\n' reward '\n' context
-- (the context as the decision holds it: packed little-endian float64), and
-- the workers add the records to the sums with the simulator's update
-- (policies.state.apply_sequence, in service.folding): a reward's arithmetic
-- in interpreted Lua was half of Redis's time per reward. The marker, the record and the log entry are
-- written by one script, so an outcome is recorded exactly once.
--
-- Only local functions: Redis forbids a script to create globals.

-- A decision as read_decision returns it: these positions (false when absent).
local STATUS, INCARNATION, MODEL_FIELD, ARM_FIELD, X_CHUNKS, DEADLINE, NUMBER = 1, 2, 3, 4, 5, 6, 7
local FIRST_CHUNKS, CHUNK_AT = 4, 8  -- x:1 .. x:4 at positions 8 .. 11: d <= 32 in one HMGET
local X, REWARD = 12, 13

-- The context is kept in chunks of at most 64 bytes ('x:1', 'x:2', ...), so
-- Redis keeps the decision hash in its compact encoding; a decision of an
-- earlier version has it whole in 'x'. 'deadline' (the end of the reward
-- window) is there when the experiment has a default reward.
--
-- Every field asked for costs Redis a search of the decision's hash (an
-- absent one, the whole hash): the first HMGET asks for what a reward reads
-- and the first four chunks; the context whole (X) is read only for a
-- pending decision without chunks, the reward a decision got (REWARD) only
-- by reward_of. X is the context joined.
local FIELDS = {'status', 'incarnation', 'model_field', 'arm_field', 'x_chunks', 'deadline', 'number',
                'x:1', 'x:2', 'x:3', 'x:4'}
local function read_decision(key)
  local decision = redis.call('HMGET', key, unpack(FIELDS))
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

-- An experiment stored by an earlier version until the service's start-up
-- upgrade: no recipes (the first version), or recipes without the ',recorded'
-- that says its outcomes are recorded, not added to the sums (service.codec
-- RECORDED; a worker of that version may still add to them). nil, or an
-- error reply.
local function unusable(model_recipe)
  if not model_recipe or string.sub(model_recipe, -9) ~= ',recorded' then
    return redis.error_reply(
      'experiment stored by an earlier version: restart the service to upgrade it')
  end
  return nil
end

-- A pending decision's record lacks what its outcome's record needs (its
-- number too when the experiment forgets, a context of the experiment's
-- size: `discount` and `context_bytes` are the meta's): an error reply (a
-- damaged record; the caller checks before it writes), else nil.
local function incomplete(decision, discount, context_bytes)
  if not (decision[MODEL_FIELD] and decision[ARM_FIELD] and decision[X]) then
    return redis.error_reply('a pending decision without its fields or context')
  end
  if discount and not tonumber(decision[NUMBER]) then
    return redis.error_reply('a decision without a number in an experiment that forgets')
  end
  if context_bytes and #decision[X] ~= tonumber(context_bytes) then
    return redis.error_reply('a pending decision whose context is not of the experiment\'s size')
  end
  return nil
end

-- The records of this call, appended by finish.
local records = {}

-- Record the outcome (the reward's text) of a pending decision.
local function append(decision, text)
  local payload = table.concat({decision[MODEL_FIELD], decision[ARM_FIELD], decision[NUMBER] or '',
                                text, decision[X]}, '\n')
  records[#records + 1] = #payload .. ':' .. payload
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

-- The end of a call that recorded or logged outcomes: the records go to the
-- outcomes string (one APPEND), and the log expires max_age after its last
-- entry.
local function finish(outcomes_key)
  if #records > 0 then
    redis.call('APPEND', outcomes_key, table.concat(records))
  end
  if log_written then
    redis.call('EXPIRE', log_written[1], log_written[2])
  end
end
