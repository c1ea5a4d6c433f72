-- Record a decision made from the statistics the worker holds, if they are current.
--
-- KEYS[1]  meta hash      lrb:{exp}:meta   (incarnation, key_hash, version)
-- KEYS[2]  stats hash     lrb:{exp}:stats  (packed sums; counters rewards, decision_seq, decisions)
-- KEYS[3]  decision hash  lrb:{exp}:decision:<id>  (a fresh id per attempt)
-- KEYS[4]  pending list   lrb:{exp}:pending  ("<expiry> <id>" per decision, oldest first)
-- ARGV[1]  SHA-256 (hex) of the caller's API key; '' for a trusted in-process caller
-- ARGV[2]  the incarnation the worker's definition belongs to
-- ARGV[3]  the meta version the worker's statistics were read at; '' accepts any
-- ARGV[4]  the rewards counter they were read at; '' accepts any
-- ARGV[5]  the decision number the random draw used; '' when the draw used none
--          (an unseeded experiment: the script assigns the next number)
-- ARGV[6]  '1' when ARGV[5] was reserved by an earlier 'stale' reply, '0' when
--          it is the worker's prediction (it must then be the next number)
-- ARGV[7]  time to live in seconds (the reward window)
-- ARGV[8]  how many rewards the statistics may lag behind (the experiment's
--          max_stale_rewards; 0: none)
-- ARGV[9..]  field, value, ... of the decision
--
-- Returns
--   {'recorded', number}  the decision is pending (also when this same decision
--                         was recorded by an earlier call whose reply was lost)
--   {'stale', version, rewards, reserved number or '', field, value, ...}
--                         nothing recorded (also when the experiment is another
--                         incarnation than ARGV[2]): the current statistics
--                         (HGETALL), and for a seeded experiment a reserved number
--                         if its definition (incarnation, version) is the one the
--                         worker checked the request against; after a change the
--                         worker checks the request again first, so that a
--                         request it then refuses takes no number
--   {'missing'}           no such experiment
--   {'forbidden'}         the key is not the experiment's

local meta = redis.call('HMGET', KEYS[1], 'incarnation', 'key_hash', 'version')
if not meta[1] then
  return {'missing'}
end
if ARGV[1] ~= '' and meta[2] ~= ARGV[1] then
  return {'forbidden'}
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  return {'recorded', tonumber(redis.call('HGET', KEYS[3], 'number'))}
end

local counters = redis.call('HMGET', KEYS[2], 'rewards', 'decision_seq')
local rewards, seq = counters[1] or '0', tonumber(counters[2] or '0')
local number = ARGV[5]
-- Another incarnation (deleted and created again meanwhile) is always stale.
local redefined = meta[1] ~= ARGV[2] or (ARGV[3] ~= '' and ARGV[3] ~= meta[3])
local stale = redefined
  or (ARGV[4] ~= '' and (tonumber(rewards) < tonumber(ARGV[4])
                         or tonumber(rewards) - tonumber(ARGV[4]) > tonumber(ARGV[8])))
  or (number ~= '' and ARGV[6] == '0' and tonumber(number) ~= seq + 1)
if stale then
  local reserved = ''
  if number ~= '' and not redefined then
    reserved = redis.call('HINCRBY', KEYS[2], 'decision_seq', 1)
  end
  local reply = {'stale', meta[3], rewards, reserved}
  local stats = redis.call('HGETALL', KEYS[2])
  for i = 1, #stats do
    reply[#reply + 1] = stats[i]
  end
  return reply
end

if number == '' then
  number = redis.call('HINCRBY', KEYS[2], 'decision_seq', 1)
elseif ARGV[6] == '0' then
  redis.call('HSET', KEYS[2], 'decision_seq', number)
end
local ttl = tonumber(ARGV[7])
redis.call('HSET', KEYS[3], 'incarnation', ARGV[2], 'number', number, unpack(ARGV, 9))
redis.call('EXPIRE', KEYS[3], ttl)
redis.call('HINCRBY', KEYS[2], 'decisions', 1)

-- List the decision, so that deleting the experiment deletes it too. All of an
-- experiment's decisions live ttl seconds, so the list is in expiry order (an
-- entry errs a second late); the list expires with its newest decision, and
-- every 64th decision drops the expired entries (up to 128) from its head, so
-- it holds the live decisions and a few more, at three calls per decision.
local now = tonumber(redis.call('TIME')[1])
local entry = (now + ttl + 1) .. ' ' .. string.match(KEYS[3], ':decision:(.*)$')
local listed = redis.call('RPUSH', KEYS[4], entry)
redis.call('EXPIRE', KEYS[4], ttl + 1)
if listed % 64 == 0 then
  local expired = 0
  for _, head in ipairs(redis.call('LRANGE', KEYS[4], 0, 127)) do
    if tonumber(string.match(head, '^%d+')) > now then
      break
    end
    expired = expired + 1
  end
  if expired > 0 then
    redis.call('LTRIM', KEYS[4], expired, -1)
  end
end
return {'recorded', tonumber(number)}
