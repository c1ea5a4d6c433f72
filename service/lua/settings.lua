-- Change an experiment's live settings: those that do not change what its
-- statistics mean (service.experiments.LIVE_SETTINGS). The definition is
-- written whole, the version bumped, so that every worker's next decision finds
-- its view stale and reads the new definition; the change goes to the log.
--
-- KEYS[1]  meta hash      lrb:{exp}:meta  (spec, config, version, default_reward,
--                          log_max_entries, log_max_age_seconds)
-- KEYS[2]  decision log   lrb:{exp}:log
-- KEYS[3]  the experiment's calls hash, and ARGV's last: this call's token (once.lua)
-- ARGV[1]  the version the caller read the definition at
-- ARGV[2]  the new spec (JSON)
-- ARGV[3]  the new config (JSON)
-- ARGV[4]  the default reward's text, or '' to leave it as it is
-- ARGV[5]  log_max_entries ('0': no log)
-- ARGV[6]  log_max_age_seconds
-- ARGV[7]  the change, as JSON, for the decision log
--
-- Returns the new version, 0 if the experiment does not exist, -1 if its
-- definition changed since ARGV[1] was read (the caller reads it again).

local resent = answered()  -- once.lua
if resent then
  return resent
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
if redis.call('HGET', KEYS[1], 'version') ~= ARGV[1] then
  return -1
end
redis.call('HSET', KEYS[1], 'spec', ARGV[2], 'config', ARGV[3])
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'default_reward', ARGV[4])
end
local max_entries = tonumber(ARGV[5])
if max_entries > 0 then
  redis.call('HSET', KEYS[1], 'log_max_entries', ARGV[5], 'log_max_age_seconds', ARGV[6])
else
  redis.call('HDEL', KEYS[1], 'log_max_entries', 'log_max_age_seconds')
end
local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
if max_entries > 0 then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', max_entries, '*', 'type', 'settings',
             'id', '', 'changes', ARGV[7])
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[6]))
end
return made(version)
