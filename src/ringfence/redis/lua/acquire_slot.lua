#!lua flags=allow-oom
-- acquire_slot: take a slot of a global concurrency limit (a semaphore whose slots are leases).
-- KEYS[1] holders  zset  holder ('<job id>:<lease token>': one attempt) -> slot lease end ms
-- ARGV[1] now ms  ARGV[2] limit  ARGV[3] holder  ARGV[4] lease end ms
-- Returns: 1 when the slot is held, 0 when the limit is reached. Slots of crashed workers end with their lease.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[1]))
if redis.call('ZSCORE', KEYS[1], ARGV[3]) or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], ARGV[4], ARGV[3])
  return 1
end
return 0
