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
-- them). A change made keeps its answer in the hash under its token; the hash
-- lives a minute after the experiment's last change (a call is sent again within
-- the store's deadline, seconds) and holds at most CALLS_KEPT answers; the call
-- sent again returns its answer without running.
local CALLS, CALL = KEYS[#KEYS], table.remove(ARGV)
local CALLS_KEPT = 256

-- This call's answer if it ran before, else nil.
local function answered()
  local kept = redis.call('HGET', CALLS, CALL)
  return kept and tonumber(kept)
end

-- A change made: its answer, kept for the call sent again.
local function made(answer)
  if redis.call('HLEN', CALLS) >= CALLS_KEPT then
    -- Changes that fast: a resend of one of those made in the last seconds (rare) runs
    -- again, answered as if refused.
    redis.call('DEL', CALLS)
  end
  redis.call('HSET', CALLS, CALL, answer)
  redis.call('EXPIRE', CALLS, 60)
  return answer
end

