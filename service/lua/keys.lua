-- Rotate or revoke an experiment's API keys. An experiment accepts its current
-- key (key_hash) and, after a rotation, the one before it (key_hash_old), until
-- that is revoked: clients move to the new key with no request refused.
--
-- KEYS[1]  meta hash  lrb:{exp}:meta  (key_hash, key_hash_old, key_nonce, key_rotated_at)
-- KEYS[2]  the experiment's calls hash, and ARGV's last: this call's token (once.lua)
-- ARGV[1]  'rotate' or 'revoke'
-- with 'rotate':
-- ARGV[2]  the SHA-256 (hex) of the new key
-- ARGV[3]  the hash of the key it replaces, as read before the new key was made
-- ARGV[4]  the nonce the new key was made with (service.definition.IdempotencyKey)
-- ARGV[5]  the time of the rotation (unix seconds)
--
-- Returns 0 when the experiment does not exist; else 1, or, for 'rotate', -1
-- when the current key is no longer the one read (another rotation came
-- between: nothing changed), or, for 'revoke', 2 when there was no previous
-- key to revoke. A change of the keys is a change
-- of the definition: the version goes up (a sharded experiment's other members
-- copy it by version, service.shards), and each worker's view reads it again.

local resent = answered()  -- once.lua
if resent then
  return resent
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
if ARGV[1] == 'rotate' then
  local current = redis.call('HGET', KEYS[1], 'key_hash')
  if current == ARGV[2] then
    -- This rotation already (a call held up in the network and delivered after its
    -- resend was answered): rotating again would revoke the key current before it.
    return 1
  end
  if current ~= ARGV[3] then
    -- A rotation made after this one was read: made now, this one would bring back a
    -- key made before that one (an attempt held up, sent again and answered).
    return -1
  end
  redis.call('HSET', KEYS[1], 'key_hash_old', current, 'key_hash', ARGV[2],
             'key_nonce', ARGV[4], 'key_rotated_at', ARGV[5])
  redis.call('HINCRBY', KEYS[1], 'version', 1)
  return made(1)
end
if redis.call('HDEL', KEYS[1], 'key_hash_old') == 1 then
  redis.call('HINCRBY', KEYS[1], 'version', 1)
  return made(1)
end
return 2
