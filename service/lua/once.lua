-- Shared by add_arms.lua, retire_arms.lua, settings.lua, keys.lua and delete.lua
-- (store.py puts this chunk in front of each).
--
-- A change of an experiment answered the same however often its call is sent.
-- redis-py resends a script whose reply was lost (its connection dropped after
-- Redis ran it), and so does the batcher on a cluster; run again, a change made
-- would be answered as refused (an arm "exists", the experiment "is gone") or made
-- twice (a settings change logged twice). Each call names a key of its own, last
-- of its keys (service.keys.call_mark: a fresh token); a change made keeps its
-- answer there until the caller has the reply (it then deletes the key; a minute
-- at most), and the call sent again returns that answer without running.
local MARK = KEYS[#KEYS]

-- This call's answer if it ran before, else nil.
local function answered()
  local kept = redis.call('GET', MARK)
  return kept and tonumber(kept)
end

-- A change made: its answer, kept for the call sent again.
local function made(answer)
  redis.call('SET', MARK, answer, 'EX', 60)
  return answer
end

