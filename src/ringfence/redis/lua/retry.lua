#!lua flags=allow-oom
-- retry: a failed attempt; the job waits in the retry set until its delay has passed.
-- KEYS[1] active   zset
-- KEYS[2] lease    hash  id -> token
-- KEYS[3] retry    zset  id -> retry-at ms
-- KEYS[4] history  hash  id -> JSON list of failed attempts
-- KEYS[5] stats    hash
-- KEYS[6] minutes  hash  per-minute counts (f<minute>: failed attempts)
-- ARGV[1] id  ARGV[2] token  ARGV[3] retry-at ms  ARGV[4] history entry JSON (an object)  ARGV[5] now ms
-- Returns: 1, or 0 when this attempt no longer held the lease (nothing changed).
--@include per_minute
local id = ARGV[1]
if redis.call('HGET', KEYS[2], id) ~= ARGV[2] then return 0 end
redis.call('ZREM', KEYS[1], id)
redis.call('HDEL', KEYS[2], id)
local hist = redis.call('HGET', KEYS[4], id)
if hist then
  hist = string.sub(hist, 1, -2) .. ',' .. ARGV[4] .. ']'
else
  hist = '[' .. ARGV[4] .. ']'
end
redis.call('HSET', KEYS[4], id, hist)
redis.call('ZADD', KEYS[3], ARGV[3], id)
redis.call('HINCRBY', KEYS[5], 'failed', 1)
per_minute(KEYS[6], 'f', ARGV[5], 1)
return 1
