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
-- them). A change made keeps its answer in the hash under its token, numbered one
-- past the highest kept (not by a clock, which a failover or a step may set back);
-- the hash lives a minute after the experiment's last change (a call is sent again
-- within the store's deadline, seconds) and holds at most CALLS_KEPT answers: past
-- that the older half goes, so that the latest CALLS_KEPT / 2 changes are always
-- answered; the call sent again returns its answer without running.
local CALLS, CALL = KEYS[#KEYS], table.remove(ARGV)
local CALLS_KEPT = 256

-- A kept answer's number ('<number> <answer>'; 0 for a bare answer, kept by an
-- earlier version).
local function number_of(kept)
  return tonumber(string.match(kept, '^(%d+) ') or '0')
end

-- This call's answer if it ran before, else nil.
local function answered()
  local kept = redis.call('HGET', CALLS, CALL)
  return kept and tonumber(string.match(kept, ' (.*)$') or kept)
end

-- A change made: its answer, kept for the call sent again.
local function made(answer)
  local fields, numbers, top = redis.call('HGETALL', CALLS), {}, 0
  for i = 2, #fields, 2 do
    numbers[#numbers + 1] = number_of(fields[i])
    top = math.max(top, numbers[#numbers])
  end
  if #numbers >= CALLS_KEPT then  -- the older half (or more) goes: the latest 127 stay
    table.sort(numbers)
    local last, old = numbers[#numbers - CALLS_KEPT / 2 + 1], {}
    for i = 1, #fields, 2 do
      if number_of(fields[i + 1]) <= last then
        old[#old + 1] = fields[i]
      end
    end
    redis.call('HDEL', CALLS, unpack(old))
  end
  -- (%.17g: every digit of a version, which '..' would round to 14)
  redis.call('HSET', CALLS, CALL, string.format('%d %.17g', top + 1, answer))
  redis.call('EXPIRE', CALLS, 60)
  return answer
end
