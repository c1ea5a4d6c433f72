-- Delete an experiment: its definition and statistics, and set its pending list aside.
--
-- KEYS[1]  meta hash      lrb:{exp}:meta
-- KEYS[2]  arms hash      lrb:{exp}:arms
-- KEYS[3]  stats hash     lrb:{exp}:stats
-- KEYS[4]  pending list   lrb:{exp}:pending
-- KEYS[5]  a fresh name for the pending list, lrb:{exp}:deleted-pending:<token>
--
-- Returns how many of KEYS[1..3] existed (0: no such experiment).
--
-- Once the meta hash is gone, decide.lua records no decision of this
-- experiment, so the list set aside holds every decision left to delete;
-- an experiment created again under the same id starts a list of its own.
-- The list keeps its time to live: if the caller never finishes deleting
-- the decisions, they and the list expire on their own.

local removed = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
if redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('RENAME', KEYS[4], KEYS[5])
end
return removed
