-- Read what a fold starts from: the experiment's incarnation, how many outcomes
-- the sums hold, and the outcomes recorded since (outcomes.lua's records).
--
-- KEYS[1]  meta hash   lrb:{exp}:meta
-- KEYS[2]  stats hash  lrb:{exp}:stats     (counter folded)
-- KEYS[3]  outcomes    lrb:{exp}:outcomes
--
-- Returns {} when the experiment does not exist, else {incarnation, folded,
-- outcomes}. It writes nothing: fold.lua writes the sums back only if no
-- fold came between (the sums the outcomes add to may be read after this,
-- as only a fold changes them).

local incarnation = redis.call('HGET', KEYS[1], 'incarnation')
if not incarnation then
  return {}
end
return {incarnation, redis.call('HGET', KEYS[2], 'folded') or '0',
        redis.call('GET', KEYS[3]) or ''}
