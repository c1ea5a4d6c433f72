-- Add what an earlier version did not record to a pending decision.
--
-- KEYS[1]  decision hash  lrb:{exp}:decision:<id>
-- ARGV     field, value, ...: each set only where the decision lacks it
--
-- Only while the decision exists: one that expired meanwhile is not created
-- again (it would never expire). Returns 1 when patched, 0 when gone.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
for i = 1, #ARGV, 2 do
  redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
end
return 1
