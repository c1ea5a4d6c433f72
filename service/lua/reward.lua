-- Apply a batch of rewards, each exactly once.
-- store.py puts damaged.lua, outcomes.lua, tail.lua and recent.lua in front of this script.
--
-- KEYS[1]  meta hash      lrb:{exp}:meta     (incarnation, key_hash, key_hash_old,
--                          model_recipe, log retention,
--                          discount, context_bytes, number_step: the shard count)
-- KEYS[2]  stats hash     lrb:{exp}:stats    (counters; the minutes' marks: recent.lua)
-- KEYS[3]  decision log   lrb:{exp}:log      (a stream; written when meta has log_max_entries)
-- KEYS[4]  outcomes       lrb:{exp}:outcomes (outcomes not yet in the sums: outcomes.lua)
-- KEYS[5..]  decision records lrb:{exp}:decision:<id>, one per reward (outcomes.lua)
-- ARGV[1]  SHA-256 (hex) of the caller's API key; '' for a trusted in-process
--          caller (a key from HTTP always hashes to 64 hex digits)
-- ARGV[2]  how many outcomes the caller holds the records of (its view's, and those
--          it kept since); '' for unknown
-- ARGV[3]  the shard count the caller routed the rewards by (service.shards: each
--          decision's member follows from its id and the count)
-- ARGV[4..]  one reward per decision key, as the shortest decimal that
--            round-trips the float64
--
-- Returns {'missing'} when the experiment does not exist, {'forbidden'} when
-- the key is not its key, {'shards', count} when it has another shard count
-- than ARGV[3] (nothing written: the caller routes again), else one status per decision, then the 'rewards'
-- counter (0 when nothing was applied), and when any was applied: the
-- incarnation, the meta version, the outcomes counter (rewards + defaulted)
-- after them, the decision counter (decision_seq), records and the position
-- of the first of them (how many outcomes came before it), so that the worker
-- adds them without reading (service.views, Views.add_own): the records this
-- call appended, or, when others' outcomes came between the ARGV[2] the
-- caller holds and these (another worker's rewards), every record after
-- ARGV[2] (unless a fold took some of them that the folded tail no longer has:
-- tail.lua). A status is 'applied',
-- 'duplicate' (the same reward was already applied: a safe retry), 'conflict'
-- (a different reward was applied), 'late' (the experiment has a default
-- reward and the decision's window has ended: the default counts, or will
-- once settle.lua reaches it; nothing changes but the 'late' counter and the
-- log) or 'not_found'.
--
-- The decision's arm and context come from its record, never from the client.
-- The marker, the outcome and the log entry happen in one script, so a client
-- retry after a lost reply sees 'rewarded' and cannot count the reward twice,
-- and the log and the outcomes string hold the rewards in one order.

begin()
local meta = redis.call('HMGET', KEYS[1], 'incarnation', 'key_hash', 'model_recipe',
                        'log_max_entries', 'log_max_age_seconds', 'discount', 'context_bytes',
                        'key_hash_old', 'version', 'number_step', 'position_weights')
if not meta[1] then
  return {'missing'}
end
if ARGV[1] ~= '' and meta[2] ~= ARGV[1] and meta[8] ~= ARGV[1] then  -- keys.lua
  return {'forbidden'}
end
if (meta[10] or '1') ~= ARGV[3] then
  return {'shards', meta[10] or '1'}
end
local refused = unusable(meta[3])
if refused then
  return refused
end
local incarnation = meta[1]
use_weights(meta[11])
local OUTAGE_MS = 7 * 24 * 3600 * 1000  -- how much longer a rewarded record waits for settle.lua
local FIRST = 5  -- KEYS[FIRST..] are the decisions; ARGV[k - FIRST + 4] is KEYS[k]'s reward

-- Every decision is read and checked before anything is written (Redis does
-- not undo a script's writes when it fails), each once: a decision named
-- twice in a batch is then a repeat of itself; and the keys written after them.
refused = mistyped({{KEYS[2], 'hash'}, {KEYS[4], 'string'},
                    tonumber(meta[4] or '0') > 0 and {KEYS[3], 'stream'} or nil})
if refused then
  return refused
end
local read = {}  -- decision key -> its fields
for k = FIRST, #KEYS do
  if not read[KEYS[k]] then
    local decision = read_decision(KEYS[k])
    if decision[STATUS] == 'pending' and decision[INCARNATION] == incarnation then
      refused = incomplete(decision, meta[6], meta[7])
      if refused then
        return refused
      end
    end
    read[KEYS[k]] = decision
  end
end

local now = nil  -- Redis's clock, read once, when first needed
local function clock()
  if not now then
    local time = redis.call('TIME')
    now = tonumber(time[1]) + tonumber(time[2]) / 1e6
  end
  return now
end
local function ended(deadline)
  if not deadline then
    return false
  end
  return clock() >= tonumber(deadline)
end

local statuses = {}
local applied, duplicates = 0, 0  -- counted once at the end
for k = FIRST, #KEYS do
  local reward = ARGV[k - FIRST + 4]
  local decision = read[KEYS[k]]
  -- A decision made before its experiment was deleted (and perhaps created
  -- again under the same id) belongs to no current experiment.
  if not decision[STATUS] or decision[INCARNATION] ~= incarnation then
    statuses[#statuses + 1] = 'not_found'
  elseif decision[STATUS] == 'rewarded' then
    if decision[REWARD] == reward then
      duplicates = duplicates + 1
      statuses[#statuses + 1] = 'duplicate'
    else
      statuses[#statuses + 1] = 'conflict'
    end
  elseif decision[STATUS] == 'defaulted' or ended(decision[DEADLINE]) then
    -- Counted and logged once per decision: a resent late reward (a client
    -- retry, or the Redis client's own) only answers 'late' again.
    if mark_late(KEYS[k], decision, reward) then
      redis.call('HINCRBY', KEYS[2], 'late', 1)
      log_outcome(KEYS[3], meta[4], meta[5], 'late', decision_id(KEYS[k]), reward)
    end
    statuses[#statuses + 1] = 'late'
  else
    append(decision, reward)
    local ttl_ms = nil  -- the record keeps its time to live
    if decision[DEADLINE] and not decision[LEGACY] then
      -- On the pending list until settle.lua reaches it, which gives it back the
      -- time to live it had: kept OUTAGE longer meanwhile, so that after a stop of
      -- the service longer than the grace period (up to OUTAGE more) settle.lua finds
      -- it rewarded rather than gone, and does not count it among defaults missed.
      -- Bounded: a record whose experiment's DELETE failed halfway still expires.
      ttl_ms = time_left(KEYS[k], decision) + OUTAGE_MS
    end
    mark_rewarded(KEYS[k], decision, reward, ttl_ms)  -- the same decision again is then a repeat
    applied = applied + 1
    log_outcome(KEYS[3], meta[4], meta[5], 'reward', decision_id(KEYS[k]), reward)
    statuses[#statuses + 1] = 'applied'
  end
end
finish(KEYS[4])
local rewards, counters = 0, nil
if applied > 0 then
  rewards = redis.call('HINCRBY', KEYS[2], 'rewards', applied)
  counters = redis.call('HMGET', KEYS[2], 'defaulted', 'decision_seq', 'folded', RECENT_MINUTE,
                        'decisions')
  mark_minute(KEYS[2], clock(), counters[4], counters[5], rewards - applied, counters[1])
end
if duplicates > 0 then
  redis.call('HINCRBY', KEYS[2], 'duplicates', duplicates)
end
statuses[#statuses + 1] = rewards
if applied > 0 then
  local outcomes = rewards + tonumber(counters[1] or '0')
  local first, sent = outcomes - applied, table.concat(records)
  local held = tonumber(ARGV[2])
  if held and held < first then  -- others' outcomes came between
    local lacking = lacked(KEYS[2], redis.call('GET', KEYS[4]) or '', held,
                           tonumber(counters[3] or '0'))
    if lacking then
      sent, first = lacking, held
    end
  end
  statuses[#statuses + 1] = incarnation
  statuses[#statuses + 1] = meta[9] or '0'
  statuses[#statuses + 1] = tostring(outcomes)
  statuses[#statuses + 1] = counters[2] or '0'
  statuses[#statuses + 1] = sent
  statuses[#statuses + 1] = first
end
return statuses
