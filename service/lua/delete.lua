-- Delete an experiment: its definition, statistics (outcomes too) and log, and set its lists of decisions aside.
--
-- KEYS[1]  meta hash      lrb:{exp}:meta
-- KEYS[2]  arms hash      lrb:{exp}:arms
-- KEYS[3]  stats hash     lrb:{exp}:stats
-- KEYS[4]  decision log   lrb:{exp}:log
-- KEYS[5]  pending list   lrb:{exp}:pending
-- KEYS[6]  settled list   lrb:{exp}:settled
-- KEYS[7]  a fresh name for the pending list, lrb:{exp}:deleted-pending:<token>
-- KEYS[8]  a fresh name for the settled list, lrb:{exp}:deleted-pending:<token'>
-- KEYS[9]  outcomes       lrb:{exp}:outcomes
-- KEYS[10] the experiment's calls hash, and ARGV's last: this call's token (once.lua)
--
-- Returns how many of KEYS[1..3] existed (0: no such experiment).
--
-- Once the meta hash is gone, decide.lua records no decision of this
-- experiment and settle.lua settles none, so the lists set aside hold every
-- decision left to delete; an experiment created again under the same id
-- starts lists of its own. The lists keep their time to live: if the caller
-- never finishes deleting the decisions, they and the lists expire on their
-- own. The log goes at once (UNLINK: Redis frees a long stream in the background).

local resent = answered()  -- once.lua
if resent then
  return resent
end
local removed = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('DEL', KEYS[9])
redis.call('UNLINK', KEYS[4])
for i = 5, 6 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('RENAME', KEYS[i], KEYS[i + 2])
  end
end
if removed > 0 then
  redis.call('DEL', KEYS[10])  -- the deleted experiment's answers: the caller removes this one
  return made(removed)
end
return removed
