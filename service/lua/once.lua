-- Shared by add_arms.lua, retire_arms.lua, settings.lua, keys.lua and delete.lua
-- (store.py puts this chunk in front of each).
--
-- A change of an experiment answered the same however often its call is sent.
-- redis-py resends a script whose reply was lost (its connection dropped after
-- Redis ran it), and so does the batcher on a cluster; run again, a change made
-- would be answered as refused (an arm "exists", the experiment "is gone") or made
-- twice (a settings change logged twice). Each call names the experiment's calls
-- hash last of its keys (service.keys.calls) and a token of its own last of its
-- arguments (taken off ARGV here: the script reads its arguments as it documents
-- them). A change made keeps its answer in the hash under its token, with its time;
-- the hash lives a minute after the experiment's last change (a call is sent again
-- within the store's deadline, seconds) and holds at most CALLS_KEPT answers: past
-- that the older half goes, so that the latest CALLS_KEPT / 2 changes are always
-- answered; the call sent again returns its answer without running.
local CALLS, CALL = KEYS[#KEYS], table.remove(ARGV)
local CALLS_KEPT = 256

-- This call's answer if it ran before, else nil ('<time> <answer>'; a bare answer
-- was kept by an earlier version).
local function answered()
  local kept = redis.call('HGET', CALLS, CALL)
  return kept and tonumber(string.match(kept, ' (.*)$') or kept)
end

-- The older half of the answers kept goes.
local function drop_older_half()
  local fields, times = redis.call('HGETALL', CALLS), {}
  for i = 2, #fields, 2 do
    times[#times + 1] = tonumber(string.match(fields[i], '^(%d+) ') or '0')
  end
  table.sort(times)
  local last, old = times[#times - CALLS_KEPT / 2 + 1], {}
  for i = 1, #fields, 2 do
    if tonumber(string.match(fields[i + 1], '^(%d+) ') or '0') <= last then
      old[#old + 1] = fields[i]
    end
  end
  redis.call('HDEL', CALLS, unpack(old))
end

-- A change made: its answer, kept for the call sent again.
local function made(answer)
  if redis.call('HLEN', CALLS) >= CALLS_KEPT then
    drop_older_half()
  end
  local now = redis.call('TIME')
  -- (microseconds: 16 digits, exact as a Lua number; %.17g: every digit of a version,
  -- which '..' would round to 14)
  redis.call('HSET', CALLS, CALL, string.format('%s%06d %.17g', now[1], now[2], answer))
  redis.call('EXPIRE', CALLS, 60)
  return answer
end
