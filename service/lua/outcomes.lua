-- Shared by reward.lua and settle.lua: store.py puts this chunk in front of
-- each (after damaged.lua, whose `damaged` it uses), so a reward and a default
-- reward are recorded by the same code.
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

-- A decision as read_decision returns it: these positions (nil when absent).
local STATUS, INCARNATION, MODEL_FIELD, ARM_FIELD, DEADLINE, NUMBER, X, REWARD = 1, 2, 3, 4, 5, 6, 7, 8
local LATE = 9     -- true once a late reward of the decision was counted
local LEGACY = 10  -- true for a decision hash of an earlier version
local SLOT = 11    -- a ranking's slot (1 the first position): its id ends '#<slot>'
local RANKED = 12  -- a slot whose state its ranking's record holds: {ranking key, where its
                   -- slots' states start (0-based), how many slots}

-- A decision's record is one string (decide.lua writes it; one GET reads it):
--   pending:  'p' incarnation '\n' number '\n' deadline '\n' model field '\n'
--             arm field '\n' arm '\n' version '\n' rewards seen '\n'
--             created at '\n' propensity '\n' context
--   settled:  'r' | 'd' incarnation '\n' number '\n' reward
-- ('p' pending, 'r' rewarded, 'd' given the default; 'l' and 'D' are 'p' and
-- 'd' once a late reward was counted). The deadline is '' without a default
-- reward (a decision hash of an earlier version may lack its number); the
-- context, last, is binary. Rewarded or settled, a record keeps what a late or repeated
-- reward is checked against (and the number, for a resent decide) and drops
-- the rest: the context and the decision's statistics are in the log.
local STATES = {p = 'pending', l = 'pending', r = 'rewarded', d = 'defaulted', D = 'defaulted'}
local PENDING = '^.([^\n]*)\n([^\n]*)\n([^\n]*)\n([^\n]*)\n([^\n]*)\n'
  .. '[^\n]*\n[^\n]*\n[^\n]*\n[^\n]*\n[^\n]*\n()'
local SETTLED = '^.([^\n]*)\n([^\n]*)\n(.*)$'

local function parse_record(raw)
  local code = string.sub(raw, 1, 1)
  local decision = {STATES[code]}
  decision[LATE] = code == 'l' or code == 'D'
  if code == 'p' or code == 'l' then
    local incarnation, number, deadline, model, arm, at = string.match(raw, PENDING)
    if not at then  -- a damaged record: incomplete() refuses it
      decision[INCARNATION] = string.match(raw, '^.([^\n]*)')
      return decision
    end
    decision[INCARNATION], decision[MODEL_FIELD], decision[ARM_FIELD] = incarnation, model, arm
    decision[X] = string.sub(raw, at)
    decision[NUMBER] = number ~= '' and number or nil
    decision[DEADLINE] = deadline ~= '' and deadline or nil
  else
    decision[INCARNATION], decision[NUMBER], decision[REWARD] = string.match(raw, SETTLED)
  end
  return decision
end

-- A ranking (decide.lua, /rank) is one record, at its slots' key with slot 0
-- (lrb:{exp}:decision:<id>#0: the same hash slot as theirs), not a record per slot:
--   'R' incarnation '\n' number '\n' deadline '\n' states '\n' lengths '\n' parts
-- states: a character per slot, a record's code ('p', 'l', 'd', 'D': pending, or
-- given the default, the capital once a late reward was counted), or 's' once
-- the slot has a record of its own (rewarded: its reward is kept there; or an
-- earlier version's); lengths: each slot's part's, comma-separated; parts: each
-- slot's pending record after its number and deadline (model field ... context).
-- Once no slot is pending, the parts and lengths go: 'R' ... '\n' states.
local RANKING = '^R([^\n]*)\n([^\n]*)\n([^\n]*)\n()([^\n]*)'

-- A ranking's slot whose record is its ranking's (`key` its own, absent): {} when
-- there is none (no ranking, or the slot's own record has gone).
local function read_ranked(key, slot)
  local ranking = string.gsub(key, '#%d+$', '#0')
  local raw = redis.pcall('GET', ranking)
  if type(raw) ~= 'string' then
    return {}
  end
  local incarnation, number, deadline, at, states = string.match(raw, RANKING)
  local code = states and string.match(states, '^[pldD]', slot)
  if not code then
    return {}
  end
  local decision = {STATES[code], incarnation}  -- a damaged ranking: incomplete() refuses it
  if code == 'p' or code == 'l' then
    local lengths, start = string.match(raw, '^\n([^\n]*)\n()', at + #states)
    local i = 0
    for length in string.gmatch(lengths or '', '%d+') do
      i = i + 1
      if i == slot then
        decision = parse_record(table.concat({code .. incarnation, number, deadline,
                                              string.sub(raw, start, start + length - 1)}, '\n'))
        break
      end
      start = start + length
    end
  else
    decision = parse_record(code .. incarnation .. '\n' .. number .. '\n')
  end
  decision[LATE] = code == 'l' or code == 'D'
  decision[RANKED] = {ranking, at - 1, #states}
  return decision
end

-- A decision hash of an earlier version, until it expires (its reward window,
-- and the grace period with a default reward). It keeps the context in
-- chunks of at most 64 bytes ('x:1', 'x:2', ...; whole in 'x' in a version
-- before), and 'deadline' with a default reward.
local HASH_FIELDS = {'status', 'incarnation', 'model_field', 'arm_field', 'deadline', 'number',
                     'x_chunks', 'reward', 'late_reward'}
local function read_hash(key)
  local h = redis.call('HMGET', key, unpack(HASH_FIELDS))
  local decision = {h[1] or nil, h[2] or nil, h[3] or nil, h[4] or nil, h[5] or nil, h[6] or nil}
  decision[REWARD], decision[LATE], decision[LEGACY] = h[8] or nil, h[9] ~= false, true
  if decision[STATUS] == 'pending' then
    local chunks = tonumber(h[7])
    if not chunks then
      decision[X] = redis.call('HGET', key, 'x') or nil
    else
      local names = {}
      for i = 1, chunks do
        names[i] = 'x:' .. i
      end
      local parts = redis.call('HMGET', key, unpack(names))
      for i = 1, chunks do
        if not parts[i] then
          return decision  -- a chunk missing: incomplete() refuses it
        end
      end
      decision[X] = table.concat(parts)
    end
  end
  return decision
end

-- The decision at `key`: {} when there is none (a GET of a hash is an error).
local function read_decision(key)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' then
    return read_hash(key)
  end
  local slot = tonumber(string.match(key, '#([1-9]%d*)$'))  -- (not '#02': another id)
  local decision
  if raw then
    decision = parse_record(raw)
  elseif slot and slot > 0 then
    decision = read_ranked(key, slot)
  else
    decision = {}
  end
  decision[SLOT] = slot
  return decision
end

-- How long (ms) the decision's record has left to live: its ranking's, for a slot
-- whose record that is.
local function time_left(key, decision)
  return redis.call('PTTL', decision[RANKED] and decision[RANKED][1] or key)
end

-- Set a slot's state in its ranking's record to `code`; once no slot is pending, the
-- record drops the slots' parts (their contexts).
local function set_ranked(decision, code)
  local ranking, at, count = decision[RANKED][1], decision[RANKED][2], decision[RANKED][3]
  local slot = decision[SLOT]
  local states = redis.call('GETRANGE', ranking, at, at + count - 1)
  if #states ~= count then
    return  -- (cannot be: read in this call; but never SETRANGE a missing key)
  end
  states = string.sub(states, 1, slot - 1) .. code .. string.sub(states, slot + 1)
  if string.find(states, '[pl]') then
    redis.call('SETRANGE', ranking, at + slot - 1, code)
  else
    redis.call('SET', ranking, redis.call('GETRANGE', ranking, 0, at - 1) .. states, 'KEEPTTL')
  end
end

-- The record of a decision once it has its reward (`code` 'r', 'd' or 'D'):
-- its context and statistics dropped; the time to live it had, or `ttl_ms` when
-- given (in the same write: one call fewer than SET, then PEXPIRE). A ranking's slot
-- given the default keeps its state in its ranking's record; rewarded, it has a record
-- of its own from then on (with its reward), as long-lived as its ranking's.
local function settle_record(key, decision, code, reward, ttl_ms)
  decision[STATUS], decision[REWARD] = STATES[code], reward
  if decision[RANKED] and code ~= 'r' then
    set_ranked(decision, code)
    return
  end
  local record = code .. decision[INCARNATION] .. '\n' .. (decision[NUMBER] or '') .. '\n' .. reward
  if decision[RANKED] then
    ttl_ms = ttl_ms or math.max(time_left(key, decision), 1)
    set_ranked(decision, 's')
    decision[RANKED] = nil
  end
  if ttl_ms then
    redis.call('SET', key, record, 'PX', ttl_ms)
  else
    redis.call('SET', key, record, 'KEEPTTL')
  end
end

-- Mark a pending decision rewarded (`ttl_ms`: settle_record's; an earlier
-- version's hash keeps its own).
local function mark_rewarded(key, decision, reward, ttl_ms)
  if decision[LEGACY] then
    redis.call('HSET', key, 'status', 'rewarded', 'reward', reward)
    decision[STATUS], decision[REWARD] = 'rewarded', reward
  else
    settle_record(key, decision, 'r', reward, ttl_ms)
  end
end

-- Mark a late reward of a decision counted: true the first time, false after.
local function mark_late(key, decision, reward)
  if decision[LATE] then
    return false
  end
  decision[LATE] = true
  if decision[LEGACY] then
    return redis.call('HSETNX', key, 'late_reward', reward) == 1
  end
  local code = decision[STATUS] == 'pending' and 'l' or 'D'
  if decision[RANKED] then
    set_ranked(decision, code)
  else
    redis.call('SETRANGE', key, 0, code)
  end
  return true
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

-- This call's state: the records appended by finish, and the log written
-- ({key, max_age} once an outcome is logged). begin() sets it afresh: as a
-- Redis 7 function library (service.store) this chunk runs once, at load,
-- and its locals outlive every call.
local records, log_written, weights
local function begin()
  records, log_written, weights = {}, nil, nil
end

-- A pending decision's record lacks what its outcome's record needs (its
-- number too when the experiment forgets, a context of the experiment's
-- size: `discount` and `context_bytes` are the meta's; a ranking's slot, its
-- position weight: use_weights first): an error reply whose code is DAMAGED (a
-- damaged record; the caller checks before it writes: service.store sends the
-- requests of a joined call refused so again one by one), else nil.
local function incomplete(decision, discount, context_bytes)
  if not (decision[MODEL_FIELD] and decision[ARM_FIELD] and decision[X]) then
    return damaged('a pending decision without its fields or context')
  end
  if discount and not tonumber(decision[NUMBER]) then
    return damaged('a decision without a number in an experiment that forgets')
  end
  -- (a deadline that is not a number would fail the script after its first writes)
  if (decision[NUMBER] and not tonumber(decision[NUMBER]))
      or (decision[DEADLINE] and not tonumber(decision[DEADLINE])) then
    return damaged('a pending decision whose number or deadline is not a number')
  end
  if context_bytes and #decision[X] ~= tonumber(context_bytes) then
    return damaged('a pending decision whose context is not of the experiment\'s size')
  end
  local slot = decision[SLOT]
  if slot and weights then  -- (append divides by it, after the first writes)
    local w = weights[math.min(slot, #weights)]
    if not (w and w > 0) then
      return damaged('a ranking\'s slot whose position weight is not a positive number')
    end
  end
  return nil
end

-- The experiment's position weights (meta's position_weights, 'w1,w2,...'; nil: none).
-- A ranking's slot j is modelled to earn w_j x'theta: its outcome r is recorded as
-- r / w_j, whose expectation is x'theta, so the sums learn theta as from a decision
-- of /choose (a slot beyond the list: the last weight). README / docs/API.md, "Rank".
local function use_weights(text)
  if text then
    weights = {}
    for w in string.gmatch(text, '[^,]+') do
      weights[#weights + 1] = tonumber(w)
    end
  end
end

-- Record the outcome (the reward's text) of a pending decision.
local function append(decision, text)
  local slot = decision[SLOT]
  if slot and weights then
    local w = weights[math.min(slot, #weights)]
    if w ~= 1 then
      text = string.format('%.17g', tonumber(text) / w)
    end
  end
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
