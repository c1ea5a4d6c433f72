-- Settle decisions whose reward window has ended: apply the experiment's
-- default reward, exactly once, to each one that got no reward. store.py puts
-- damaged.lua, outcomes.lua and recent.lua in front of this script, so the default is
-- recorded as reward.lua records a reward.
--
-- KEYS[1]  meta hash      lrb:{exp}:meta     (incarnation, default_reward, model_recipe,
--                          log retention, discount, context_bytes)
-- KEYS[2]  stats hash     lrb:{exp}:stats    (counters defaulted, defaults_missed; the
--                          minutes: recent.lua)
-- KEYS[3]  decision log   lrb:{exp}:log
-- KEYS[4]  pending list   lrb:{exp}:pending  ("<deadline> <id>", in deadline order)
-- KEYS[5]  settled list   lrb:{exp}:settled  ("<expiry> <id>": settled decisions until they expire)
-- KEYS[6]  outcomes       lrb:{exp}:outcomes (outcomes not yet in the sums: outcomes.lua)
-- KEYS[7..]  decision records lrb:{exp}:decision:<id>, one per ARGV[2..] entry, in order
-- ARGV[1]  how many due entries to return for the next call (0: none)
-- ARGV[2]  the grace period in seconds (a settled decision lives until its deadline
--          plus this; a rewarded one waited longer, until it is settled here)
-- ARGV[3..]  entries of the pending list, as an earlier call returned them
--
-- Returns {'missing'} when the experiment does not exist or has no default
-- reward (it was deleted and created again without one); else
-- {defaulted, missed, counter, entry, ...}: how many of the given decisions got
-- the default now, how many could not (their records gone: the service was
-- stopped for longer than the grace period; or damaged, which a default could
-- not be recorded from: the record is left as it is, its entry goes), the
-- 'defaulted' counter (0 when no default was applied now), and up to
-- ARGV[1] entries now due, from the head of the pending list.
--
-- The given entries are settled only while they are still the head of the
-- pending list, and each decision's status changes from 'pending' to
-- 'defaulted' in this script: several workers may call it with the same
-- entries and a default counts once. A rewarded or defaulted decision is
-- settled as it is. A settled decision keeps its marker (status, reward) but
-- not its context until it expires (the grace period after its window), so
-- that a late reward is recognised, and moves to the settled list, from
-- which DELETE still finds it.

begin()
local meta = redis.call('HMGET', KEYS[1], 'incarnation', 'default_reward', 'model_recipe',
                        'log_max_entries', 'log_max_age_seconds', 'discount', 'context_bytes',
                        'position_weights')
if not meta[1] or not meta[2] then
  return {'missing'}
end
use_weights(meta[8])
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1e6
local FIRST = 7  -- KEYS[FIRST + i - 1] is the decision of ARGV[i + 2]
local GRACE_MS = tonumber(ARGV[2]) * 1000

local function deadline(entry)
  return tonumber(string.match(entry, '^[%d.]+'))
end

-- The given entries still at the head of the list and due, with their decisions.
local function claimable()
  local given = #KEYS - FIRST + 1
  local head = redis.call('LRANGE', KEYS[4], 0, given - 1)
  local decisions = {}
  for i = 1, given do
    local entry = ARGV[i + 2]
    if head[i] ~= entry or deadline(entry) > now then
      break
    end
    local key = KEYS[FIRST + i - 1]
    if decision_id(key) ~= string.match(entry, ' (.*)$') then
      return nil, redis.error_reply('settle.lua: decision key ' .. i .. ' does not match its entry')
    end
    decisions[i] = read_decision(key)
  end
  return decisions, nil
end

-- An earlier version's decision hash, settled: keep what a late or repeated
-- reward is checked against (status, reward, incarnation, the late reward
-- already counted; and number, for a resent decide), drop the rest, as a
-- record is settled (outcomes.lua).
local KEPT = {'status', 'incarnation', 'reward', 'number', 'late_reward'}
local function strip(key, left)
  local values = redis.call('HMGET', key, unpack(KEPT))
  local fields = {}
  for i, name in ipairs(KEPT) do
    if values[i] then
      fields[#fields + 1] = name
      fields[#fields + 1] = values[i]
    end
  end
  redis.call('DEL', key)
  redis.call('HSET', key, unpack(fields))
  redis.call('PEXPIRE', key, left)
end

-- Give a pending decision the default reward, and drop what a settled
-- decision no longer needs; the milliseconds it has left to live: the rest of
-- its grace period after its deadline (a rewarded decision waited here longer,
-- reward.lua), or none, and it goes now, once that has passed.
local function settle(key, decision, default, entry)
  if decision[STATUS] == 'pending' then
    if decision[LEGACY] then
      redis.call('HSET', key, 'status', 'defaulted', 'reward', default)
    else
      settle_record(key, decision, decision[LATE] and 'D' or 'd', default)
    end
  end
  local left = redis.call('PTTL', key)
  if not decision[LEGACY] then
    left = math.floor((deadline(entry) - now) * 1000 + GRACE_MS)
    -- A slot its ranking's record holds: that record's time, which its other slots
    -- share (the same deadline); left to expire, as theirs would have.
    local holder = decision[RANKED] and decision[RANKED][1] or key
    if left <= 0 then
      if holder == key then
        redis.call('DEL', key)
      end
      return 0
    end
    redis.call('PEXPIRE', holder, left)
  end
  -- every decision has a time to live; never make one without
  if left > 0 and decision[LEGACY] then
    strip(key, left)
  end
  return left
end

-- A pending decision recorded under the entry's id with another deadline: a caller's
-- id used again once the entry's own decision had expired unsettled (the sweepers
-- stopped for longer than the grace period). That one is missed; this one has an entry
-- of its own and must not get the default before its window ends.
local function another(decision, entry)
  return decision[STATUS] == 'pending' and not decision[LEGACY] and decision[DEADLINE]
    and decision[DEADLINE] ~= string.match(entry, '^([^ ]*) ')
end

local defaulted, missed, counter = 0, 0, 0
if #KEYS >= FIRST then
  local refused = unusable(meta[3]) or mistyped({{KEYS[2], 'hash'}, {KEYS[6], 'string'},
    tonumber(meta[4] or '0') > 0 and {KEYS[3], 'stream'} or nil})
  if refused then
    return refused
  end
  local decisions, mismatch = claimable()
  if mismatch then
    return mismatch
  end
  -- Checked whole before anything is written. A damaged decision is missed, not
  -- refused as a batch of rewards is: refused, it would hold every later decision of
  -- the experiment back from its default for as long as its entry heads the list.
  local damaged = {}
  for i, decision in ipairs(decisions) do
    if decision[STATUS] == 'pending' and decision[INCARNATION] == meta[1] then
      damaged[i] = incomplete(decision, meta[6], meta[7]) ~= nil
    end
  end
  local longest = 0  -- ms the settled list must outlive its newest entry by
  local seen = {}  -- a decision listed twice (a caller's id used again) settles once
  for i, decision in ipairs(decisions) do
    local key = KEYS[FIRST + i - 1]
    if seen[key] then  -- listed again: settled once, its entry goes with the others
    elseif damaged[i] then
      missed = missed + 1
      seen[key] = true
    elseif another(decision, ARGV[i + 2]) then
      missed = missed + 1  -- (not seen: the record's own entry may follow in this call)
    else
      if not decision[STATUS] then
        missed = missed + 1
      elseif decision[INCARNATION] == meta[1] then
        if decision[STATUS] == 'pending' then
          append(decision, meta[2])
          log_outcome(KEYS[3], meta[4], meta[5], 'default', decision_id(key), meta[2])
          defaulted = defaulted + 1
        end
        local left = settle(key, decision, meta[2], ARGV[i + 2])
        if left > 0 then
          redis.call('RPUSH', KEYS[5], string.format('%.3f', now + left / 1000) .. ' '
                     .. decision_id(key))
          longest = math.max(longest, left)
        end
      end
      seen[key] = true
    end
  end
  finish(KEYS[6])
  if #decisions > 0 then
    redis.call('LTRIM', KEYS[4], #decisions, -1)
  end
  if defaulted > 0 then
    counter = redis.call('HINCRBY', KEYS[2], 'defaulted', defaulted)
    local counters = redis.call('HMGET', KEYS[2], RECENT_MINUTE, 'decisions', 'rewards')
    mark_minute(KEYS[2], now, counters[1], counters[2], counters[3], counter - defaulted)
  end
  if missed > 0 then
    redis.call('HINCRBY', KEYS[2], 'defaults_missed', missed)
  end
  if longest > 0 and redis.call('PTTL', KEYS[5]) < longest + 1000 then
    redis.call('PEXPIRE', KEYS[5], longest + 1000)
  end
  -- Drop the settled entries whose decisions have expired (up to 128 a call).
  local expired = 0
  for _, entry in ipairs(redis.call('LRANGE', KEYS[5], 0, 127)) do
    if deadline(entry) > now then
      break
    end
    expired = expired + 1
  end
  if expired > 0 then
    redis.call('LTRIM', KEYS[5], expired, -1)
  end
end

local reply = {defaulted, missed, counter}
local wanted = tonumber(ARGV[1])
local first = redis.call('LINDEX', KEYS[4], 0)
if wanted > 0 and first and deadline(first) <= now then
  for _, entry in ipairs(redis.call('LRANGE', KEYS[4], 0, wanted - 1)) do
    if deadline(entry) > now then
      break
    end
    reply[#reply + 1] = entry
  end
end
return reply
