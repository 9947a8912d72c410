#!lua flags=allow-oom
-- requeue: give a job back WITHOUT counting the attempt (shutdown, retry-later, payload from a newer release).
-- KEYS[1] active     zset
-- KEYS[2] lease      hash  id -> token
-- KEYS[3] attempts   hash  id -> attempts started
-- KEYS[4] pending    list
-- KEYS[5] scheduled  zset  id -> run-at ms
-- KEYS[6] stats      hash
-- KEYS[7] idle       zset
-- ARGV[1] id  ARGV[2] token  ARGV[3] run-at ms (<= now: head of the queue)  ARGV[4] now ms
-- ARGV[5] stats counter to increment  ARGV[6] wake channel
-- Returns: 1, or 0 when this attempt no longer held the lease.
local id = ARGV[1]
if redis.call('HGET', KEYS[2], id) ~= ARGV[2] then return 0 end
redis.call('ZREM', KEYS[1], id)
redis.call('HDEL', KEYS[2], id)
if redis.call('HINCRBY', KEYS[3], id, -1) <= 0 then redis.call('HDEL', KEYS[3], id) end
local now = tonumber(ARGV[4])
if tonumber(ARGV[3]) > now then
  redis.call('ZADD', KEYS[5], ARGV[3], id)
else
  redis.call('RPUSH', KEYS[4], id)
  if redis.call('ZCOUNT', KEYS[7], now, '+inf') > 0 then redis.call('PUBLISH', ARGV[6], 1) end
end
redis.call('HINCRBY', KEYS[6], ARGV[5], 1)
return 1
