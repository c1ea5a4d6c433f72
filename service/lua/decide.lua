-- Record decisions made from the statistics the worker holds, if they are current.
-- store.py puts damaged.lua, tail.lua and recent.lua in front of this script.
--
-- A call records one or more decisions of one experiment (its parts, in turn: a
-- worker's batch joins those of one turn, service.store.Joining), each as a call of
-- its own would, but that the parts share the reads of the experiment's meta and
-- counters, one clock reading, and one write of the counters, the pending list and
-- the log's expiry (BENCHMARKS.md §26). The first part's KEYS and ARGV are as below,
-- as they were of a call of one decision (so that such a call costs what it did);
-- each further part's three keys (its KEYS[3], [7] and [8] below) and its arguments
-- (its ARGV[2 ..] below) follow; then come the parts' argument counts, and the number
-- of parts, so that ARGV ends: count 1, ..., count n, n.
-- Returns a reply per part, as below; {'error', message} for a part whose command
-- failed (its own: a key of the wrong type; the experiment's, such as a write refused
-- for memory, is every later part's too).
-- What a part's KEYS and ARGV are (K and A in the script):
--
-- KEYS[1]  meta hash      lrb:{exp}:meta   (incarnation, key_hash, key_hash_old, version,
--                          default_reward, log_max_entries, log_max_age_seconds,
--                          number_step: a shard's decision numbers go up by the
--                          experiment's shard count, service.shards; else 1)
-- KEYS[2]  stats hash     lrb:{exp}:stats  (packed sums; counters rewards, defaulted,
--                          decision_seq, decisions; the sums with KEYS[6]'s outcomes
--                          added are the statistics; the minutes' marks: recent.lua)
-- KEYS[3]  decision record lrb:{exp}:decision:<id>  (a fresh id per request; a string,
--          whose format outcomes.lua describes); a ranking's (/rank): its one record,
--          lrb:{exp}:decision:<id>#0, whose key says it is one (its slots' keys,
--          <id>#<slot>, hold a slot's record only once it has its reward: outcomes.lua)
-- KEYS[4]  pending list   lrb:{exp}:pending  ("<deadline> <id>" per decision, in deadline order)
-- KEYS[5]  decision log   lrb:{exp}:log      (a stream; written when meta has log_max_entries)
-- KEYS[6]  outcomes       lrb:{exp}:outcomes (outcomes not yet in the sums: outcomes.lua)
-- KEYS[7]  request lrb:{exp}:request:<id>, read and written only with ARGV[12]: a decision
--          id the caller chose; a request already answered under it gets the same answer
--          (idempotent); 'p' incarnation '\n' digest '\n' number '\n' answer
-- KEYS[8]  read only with ARGV[12]: the record the caller's id names on the other route (a
--          /choose's id: the ranking's, <id>#0; a /rank's: the decision <id>): while it
--          lives, the id is taken there ('spent')
-- ARGV[1]  SHA-256 (hex) of the caller's API key; '' for a trusted in-process caller
-- ARGV[2]  the incarnation the worker's definition belongs to
-- ARGV[3]  the meta version the worker's statistics were read at; '' accepts any
-- ARGV[4]  the outcomes counter (rewards + defaulted) they were read at; '' accepts any
-- ARGV[5]  the decision number the random draw used; '' when the draw used none
--          (an unseeded experiment: the script assigns the next number)
-- ARGV[6]  '1' when ARGV[5] was reserved by an earlier 'stale' reply, '0' when
--          it is the worker's prediction (it must then be the next number: the
--          last one plus number_step)
-- ARGV[7]  the reward window in seconds
-- ARGV[8]  how many outcomes (rewards or default rewards) the statistics may lag
--          behind (the experiment's max_stale_rewards; 0: none)
-- ARGV[9]  the grace period in seconds: with a default reward a decision lives
--          this much longer than its window, so that settle.lua can still
--          apply the default after a pause of the service, and then recognise
--          a late reward
-- ARGV[10] how many outcomes the worker's statistics hold (the sums' folded
--          count when read, and the records the worker added); '' for unknown
-- ARGV[11] the pending record's end, after its deadline: model field '\n' arm
--          field '\n' arm '\n' version '\n' rewards seen '\n' created at '\n'
--          propensity '\n' context (packed); a ranking's: its slots' ends' lengths
--          (comma-separated) '\n' the ends, one after the other
-- ARGV[12] with KEYS[7]: the digest of the request (what it asked for)
-- ARGV[13] with KEYS[7]: the answer but its number: arm '\n' propensity '\n' index
--          ('' while exploring)
-- ARGV[14] with KEYS[7]: how long (seconds) a retry gets the same answer (at most the
--          decision's own time to live)
-- ARGV[15] k, the slots recorded (1 for a decision of /choose): each slot is a decision
--          of its own to reward.lua and settle.lua (<id>#<slot>), all recorded here or
--          none, under one decision number
-- ARGV[16 ..]  field, value, ... of the decision's log entry, but its number (which
--          the script adds): type ('decision'), id, arm, x, version, rewards_seen,
--          eligible, propensity; a ranking's one entry for all its slots: type
--          'ranking', arms and propensities comma-separated, x one after the other
--          (service.decisions._slots)
--
-- Returns
--   {'recorded', number}  the decision is recorded (also when an earlier call whose
--                         reply was lost recorded it: it may be rewarded or settled
--                         since)
--   {'stale', version, outcomes counter, reserved number or '', outcomes, 'full',
--    incarnation, field, value, ...}
--   {'stale', version, outcomes counter, reserved number or '', outcomes, 'partial', based,
--    decision_seq, skipped}
--                         nothing recorded (also when the experiment is another
--                         incarnation than ARGV[2]): the current statistics
--                         (the outcomes string, then HGETALL of the stats
--                         hash), or, when the worker's statistics can catch up
--                         with them (same definition, and no fold took an
--                         outcome they do not hold that the folded tail no
--                         longer has: tail.lua), only the counters and the
--                         outcomes they lack, given from outcome number `based`
--                         (the records after the first `skipped`, which they
--                         hold: ARGV[10] - based, or all there are); and for a
--                         seeded experiment a reserved number
--                         if its definition (incarnation, version) is the one the
--                         worker checked the request against; after a change the
--                         worker checks the request again first, so that a
--                         request it then refuses takes no number
--   {'missing'}           no such experiment
--   {'forbidden'}         the key is not the experiment's
--   {'repeat', number, answer, seconds, ...}  KEYS[7]'s request was answered before, with
--                         the same digest: that answer (ARGV[13]'s format), and how long
--                         each slot's reward may still come in; nothing recorded
--   {'conflict'}          KEYS[7]'s id was used by a request with another digest
--   {'spent'}             KEYS[7]'s id has a live decision but its answer is no longer
--                         kept (older than ARGV[14]): nothing recorded

local meta = redis.call('HMGET', KEYS[1], 'incarnation', 'key_hash', 'version', 'default_reward',
                        'log_max_entries', 'log_max_age_seconds', 'key_hash_old', 'number_step')
-- The parts' arguments: where each starts and ends.
local parts = tonumber(ARGV[#ARGV])
local firsts, lasts = {}, {}
local at = 2
for p = 1, parts do
  firsts[p], lasts[p] = at, at + tonumber(ARGV[#ARGV - parts + p - 1]) - 1
  at = lasts[p] + 1
end
local function every(reply)  -- the whole call's answer, each part's
  local replies = {}
  for p = 1, parts do
    replies[p] = reply
  end
  return replies
end
if not meta[1] then
  return every({'missing'})
end
if ARGV[1] ~= '' and meta[2] ~= ARGV[1] and meta[7] ~= ARGV[1] then  -- keys.lua
  return every({'forbidden'})
end
-- The experiment's keys every part writes, checked before any write (damaged.lua): a
-- pending list or log of another type failed the call after its decisions were recorded.
-- (The stats hash's type fails the counters' read below, before any write.)
local refused = mistyped({{KEYS[4], 'list'},
                          tonumber(meta[5] or '0') > 0 and {KEYS[5], 'stream'} or nil})
if refused then
  return refused
end

-- How long (s) the reward of the decision at `key` may still come: until its deadline
-- with a default reward, else its record's time to live (the window); 0 once it has
-- its reward or default, or is gone (or an earlier version's hash: a repeat of it
-- reports 0 rather than guess). A ranking's slot `slot` (`key` the ranking's): from its
-- state in the ranking's record, or its own record once it has one.
local function window_left(key, slot)
  local raw = redis.pcall('GET', key)
  if slot then  -- `key` the ranking's
    local own = string.sub(key, 1, -2) .. slot
    local record = redis.pcall('GET', own)
    if type(record) == 'string' or type(raw) ~= 'string' then
      key, raw = own, record
    else  -- the ranking's record holds the slot: the slot's state, the ranking's deadline
      local states = string.match(raw, '^R[^\n]*\n[^\n]*\n[^\n]*\n([^\n]*)') or ''
      raw = string.sub(states, slot, slot) .. string.sub(raw, 2)
    end
  end
  if type(raw) ~= 'string' then
    return 0
  end
  local code = string.sub(raw, 1, 1)
  if code ~= 'p' and code ~= 'l' then
    return 0
  end
  local deadline = string.match(raw, '^.[^\n]*\n[^\n]*\n([^\n]*)\n')
  if deadline and deadline ~= '' then
    local time = redis.call('TIME')
    return math.max(0, math.ceil(tonumber(deadline) - tonumber(time[1]) - tonumber(time[2]) / 1e6))
  end
  return math.max(0, redis.call('TTL', key))
end

-- The record's incarnation, if any (any state; an earlier version's hash: the
-- experiment's, as it holds no other).
local function incarnation_of(key)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' then
    return redis.call('HGET', key, 'incarnation') or meta[1]
  end
  return raw and string.match(raw, '^.([^\n]*)')
end

-- What the parts share: the counters (read once; the parts' changes written once, before
-- a stale part's reply reads the stats hash and at the end), the outcomes string (no
-- part writes it), the clock, the last listed deadline, and what the parts list.
local counters = redis.call('HMGET', KEYS[2], 'rewards', 'decision_seq', 'folded', 'decisions',
                            'defaulted', RECENT_MINUTE)
-- Outcomes applied, rewards and default rewards alike: either changes the statistics.
local rewards = tostring(tonumber(counters[1] or '0') + tonumber(counters[5] or '0'))
local seq = tonumber(counters[2] or '0')
local decisions = tonumber(counters[4] or '0')
local marked = counters[6]
local changed = false  -- seq or decisions since they were read or written
local step = tonumber(meta[8] or '1')
local defaulted = meta[4] ~= false  -- the experiment has a default reward
local max_entries = tonumber(meta[5] or '0')
local outcomes, now, listed  -- read when first needed
local entries, longest, logged = {}, 0, false

local function write_counters()
  if changed then
    redis.call('HSET', KEYS[2], 'decision_seq', seq, 'decisions', decisions)
    changed = false
  end
end

-- One part: K and A its KEYS and ARGV as a call of one decision had them (its log
-- entry's fields A[16 .. last]).
local function decide(K, A, last)
  local ranked = string.sub(K[3], -2) == '#0'
  local slots = tonumber(A[15])
  local request = A[12] ~= ''
  if request then
    local earlier = redis.call('GET', K[7])
    if earlier then
      local incarnation, digest, number, answer =
        string.match(earlier, '^p([^\n]*)\n([^\n]*)\n([^\n]*)\n(.*)$')
      if not incarnation then  -- kept by the version before incarnations (a hex digest first)
        incarnation = meta[1]
        digest, number, answer = string.match(earlier, '^([^\n]*)\n([^\n]*)\n(.*)$')
      end
      if incarnation == meta[1] then  -- else: the experiment's before a DELETE, not this one's
        if digest ~= A[12] then
          return {'conflict'}
        end
        local reply = {'repeat', tonumber(number), answer}
        for slot = 1, slots do  -- a ranking's slots: each its own
          reply[#reply + 1] = window_left(K[3], ranked and slot or nil)
        end
        return reply
      end
    end
  end
  -- The caller's id names a live decision of the other route: for a /choose, a ranking
  -- (its record, or its first slot's own: kept longer once rewarded, or an earlier
  -- version's).
  if request and (incarnation_of(K[8]) == meta[1] or (not ranked and
      incarnation_of(string.sub(K[8], 1, -2) .. '1') == meta[1])) then
    return {'spent'}
  end
  local existing = redis.pcall('GET', K[3])
  if existing then
    local incarnation, recorded
    if type(existing) == 'table' then  -- an earlier version's decision hash
      local fields = redis.call('HMGET', K[3], 'incarnation', 'number')
      incarnation, recorded = fields[1] or meta[1], fields[2]
    else
      incarnation, recorded = string.match(existing, '^.([^\n]*)\n([^\n]*)')  -- any state
    end
    if incarnation == meta[1] then
      if request then
        -- The caller's id, answered longer ago than its request is kept (A[14]):
        -- the answer is gone, and a fresh one under the same id would contradict it.
        return {'spent'}
      end
      return {'recorded', tonumber(recorded)}  -- by an earlier call whose reply was lost
    end
    -- else a decision of the experiment before a DELETE, left behind: replaced below
  end
  if request and ranked then
    -- A slot's own record under the caller's id: of this experiment (rewarded, it
    -- outlives its ranking's; or an earlier version's ranking, a record per slot), the
    -- id is taken; of the experiment before a DELETE, left behind, it would hide the new
    -- slot (outcomes.lua reads a slot's own record first): gone.
    local prefix = string.sub(K[3], 1, -2)
    for slot = 1, slots do
      local incarnation = incarnation_of(prefix .. slot)
      if incarnation == meta[1] then
        return {'spent'}
      elseif incarnation then
        redis.call('DEL', prefix .. slot)
      end
    end
  end

  local number = A[5]
  -- Another incarnation (deleted and created again meanwhile) is always stale.
  local redefined = meta[1] ~= A[2] or (A[3] ~= '' and A[3] ~= meta[3])
  local stale = redefined
    or (A[4] ~= '' and (tonumber(rewards) < tonumber(A[4])
                        or tonumber(rewards) - tonumber(A[4]) > tonumber(A[8])))
    or (number ~= '' and A[6] == '0' and tonumber(number) ~= seq + step)
  if stale then
    -- (Read before the reservation's write: an outcomes key of another type fails the
    -- part with nothing written.)
    if outcomes == nil then
      outcomes = redis.call('GET', K[6]) or ''
    end
    local reserved = ''
    if number ~= '' and not redefined then
      -- Set aside now, as a call of its own did: a write refused (out of memory) fails
      -- this part alone, and leaves nothing for the call's last write.
      redis.call('HSET', K[2], 'decision_seq', seq + step, 'decisions', decisions)
      seq, changed = seq + step, false
      reserved = seq
    end
    local reply = {'stale', meta[3], rewards, reserved, outcomes}
    if not redefined and A[10] ~= '' then
      -- Only the outcomes the worker lacks; decision_seq as HGETALL would give it:
      -- after the reservation, if any.
      local records, based, skipped = lacked(K[2], outcomes, tonumber(A[10]),
                                             tonumber(counters[3] or '0'))
      if records then
        reply[5], reply[6], reply[7] = records, 'partial', string.format('%d', based)
        reply[8], reply[9] = string.format('%d', seq), skipped
        return reply
      end
    end
    -- Whose statistics these are: another incarnation's when it was created again.
    reply[6], reply[7] = 'full', meta[1]
    write_counters()
    local stats = redis.call('HGETALL', K[2])
    for i = 1, #stats do
      reply[#reply + 1] = stats[i]
    end
    return reply
  end

  if now == nil then
    local time = redis.call('TIME')
    now = tonumber(time[1]) + tonumber(time[2]) / 1e6
  end
  local window = tonumber(A[7])
  local ends = now + window
  local ttl = window
  if defaulted then
    -- Never before the last listed deadline: settle.lua reads the list in order,
    -- and a worker's window (A[7]) may lag a PATCH that made it longer when it
    -- retries without the version (A[3] ''). Such a decision waits a little
    -- longer for its default instead of hiding a due one behind it.
    if listed == nil then
      local last = redis.call('LINDEX', K[4], -1)
      listed = last and tonumber(string.match(last, '^[%d.]+')) or false
    end
    local later = listed and listed - ends or 0
    if later > 0 then
      ends = listed
    end
    ttl = window + tonumber(A[9]) + (later > 0 and math.ceil(later) or 0)
  end
  local deadline = string.format('%.3f', ends)
  if number == '' then
    number = seq + step
  end
  -- A ranking is one record, its slots' states in it (a key per slot cost Redis more
  -- than the rest of the ranking's recording: BENCHMARKS.md §22).
  local head = {ranked and 'R' .. A[2] or 'p' .. A[2], number, defaulted and deadline or '',
                ranked and string.rep('p', slots) .. '\n' .. A[11] or A[11]}
  redis.call('SET', K[3], table.concat(head, '\n'), 'EX', ttl)

  -- Recorded: the number taken (unless a stale reply set it aside), the decision
  -- counted (a ranking's slots each), the minute marked with the counters before it.
  mark_minute(K[2], now, marked, decisions, counters[1], counters[5])
  marked = math.floor(now / 60)
  if A[5] == '' or A[6] == '0' then
    seq = tonumber(number)
  end
  decisions, changed = decisions + slots, true
  if request then
    redis.call('SET', K[7], 'p' .. meta[1] .. '\n' .. A[12] .. '\n' .. number .. '\n' .. A[13],
               'EX', math.min(ttl, tonumber(A[14])))
  end
  -- Listed by the end of its window, after the parts before it (see below).
  local entry = deadline .. ' ' .. string.match(K[3], ':decision:(.*)$')
  if ranked then  -- each slot: <id>#<slot>
    local prefix = string.sub(entry, 1, -2)
    for slot = 1, slots do
      entries[#entries + 1] = prefix .. slot
    end
  else
    entries[#entries + 1] = entry
  end
  if defaulted then
    listed = tonumber(deadline)
  end
  longest = math.max(longest, ttl)

  -- The decision log: the decision as it was made, as the caller wrote its
  -- entry (building it here, from the record's fields, doubled the script's
  -- time), with its number. Its entry id is its time (Redis's clock, ms); the
  -- oldest entries go beyond log_max_entries (whole nodes of the stream at a
  -- time: '~'); the log's age and expiry are kept below, once for the call.
  if max_entries > 0 then
    redis.call('XADD', K[5], 'MAXLEN', '~', max_entries, '*', 'number', number,
               unpack(A, 16, last))
    logged = true
  end
  return {'recorded', tonumber(number)}
end

local replies = {}
for p = 1, parts do
  local K, A, last = KEYS, ARGV, lasts[1]
  if p > 1 then
    K = {KEYS[1], KEYS[2], KEYS[3 * p + 3], KEYS[4], KEYS[5], KEYS[6], KEYS[3 * p + 4],
         KEYS[3 * p + 5]}
    A = {ARGV[1], unpack(ARGV, firsts[p], lasts[p])}
    last = #A
  end
  local ok, reply = pcall(decide, K, A, last)
  if ok then
    replies[p] = reply
  else  -- (a table with the message, or the message)
    local message = type(reply) == 'table' and (reply.err or '') or tostring(reply)
    if string.find(message, 'Script killed', 1, true) then
      error(reply)  -- SCRIPT KILL (Redis 6.2 raises it in the script): the whole call stops
    end
    replies[p] = {'error', message}
  end
end
write_counters()
if #entries == 0 then
  return replies
end
-- The log expires log_max_age_seconds after its last entry.
local age = tonumber(meta[6])
if logged then
  redis.call('EXPIRE', KEYS[5], age)
end

-- List the decisions by the end of their windows. With a default reward the
-- window may grow but never shrink (service.lifecycle, Lifecycle._changed), so the list
-- is in deadline order, and settle.lua takes the entries whose window has
-- ended from its head. Without, the list only lets DELETE find the decisions:
-- it expires with its newest decision, and for each multiple of 64 the list crosses
-- the expired entries (up to 128) go from its head, so it holds the live decisions
-- and a few more (a window made shorter only delays the drop; the list's TTL
-- is never shortened).
local length = redis.call('RPUSH', KEYS[4], unpack(entries))
if defaulted then
  -- Never expires: settle.lua must find every entry, even after an outage
  -- longer than the grace period (it then counts the decision as missed).
  redis.call('PERSIST', KEYS[4])
elseif redis.call('TTL', KEYS[4]) < longest + 1 then
  -- Never shortened: after a shorter window the older decisions outlive the new.
  redis.call('EXPIRE', KEYS[4], longest + 1)
end
local crossed = math.floor(length / 64) - math.floor((length - #entries) / 64)
if crossed > 0 and not defaulted then
  local expired = 0
  for _, head in ipairs(redis.call('LRANGE', KEYS[4], 0, 128 * crossed - 1)) do
    if tonumber(string.match(head, '^[%d.]+')) + 1 > now then
      break
    end
    expired = expired + 1
  end
  if expired > 0 then
    redis.call('LTRIM', KEYS[4], expired, -1)
  end
end
-- As the list crosses a multiple of 64, the log's entries older than its age go.
if logged and crossed > 0 then
  redis.call('XTRIM', KEYS[5], 'MINID', '~', string.format('%.0f', (now - age) * 1000))
end
return replies
