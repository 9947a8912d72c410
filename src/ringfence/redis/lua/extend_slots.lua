#!lua flags=allow-oom
-- extend_slots: renew the slots of a global concurrency limit held by this worker's running jobs (heartbeat).
-- KEYS[1] holders  zset  holder ('<job id>:<lease token>': one attempt) -> slot lease end ms
-- ARGV pairs: holder, new slot lease end ms
-- Returns: how many slots were renewed (a slot that ended meanwhile is not taken again).
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[i + 1], ARGV[i])
    n = n + 1
  end
end
return n
