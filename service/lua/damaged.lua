-- Shared by decide.lua, reward.lua and settle.lua (store.py puts this chunk in
-- front of each, before outcomes.lua; a function library defines it once).
--
-- An error reply whose code is DAMAGED: what a call refuses whole, before it writes,
-- when the experiment's keys are not as the scripts leave them.
local function damaged(message)
  return redis.error_reply('DAMAGED ' .. message)
end

-- The keys a call writes after its first write are of the types they must be (none
-- yet will do), else a DAMAGED reply naming the first that is not, before anything is
-- written: a write to a key of another type (left there by hand) failed the script
-- after its first writes (a decision marked rewarded with its outcome lost; decisions
-- recorded, counted and listed whose callers got an error). `expected`: {key, type}
-- pairs, in order; a nil entry ends them (a key the call does not write).
local function mistyped(expected)
  for _, key_type in ipairs(expected) do
    local kind = redis.call('TYPE', key_type[1])['ok']
    if kind ~= key_type[2] and kind ~= 'none' then
      return damaged(key_type[1] .. ' holds a ' .. kind .. ', not a ' .. key_type[2])
    end
  end
  return nil
end
