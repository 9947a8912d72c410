#!lua flags=allow-oom
-- purge: delete up to ARGV[1] of a queue's pending jobs, oldest first (one bounded batch per call).
-- The caller first moves pending jobs that own a fence step past capture to dead-letter (cancel.lua).
-- KEYS[1] pending list  KEYS[2] jobs hash  KEYS[3] attempts hash  KEYS[4] history hash  KEYS[5] stats hash
-- ARGV[1] max jobs
-- Returns: how many jobs were deleted.
local ids = redis.call('RPOP', KEYS[1], tonumber(ARGV[1]))
if not ids then return 0 end
for _, id in ipairs(ids) do
  redis.call('HDEL', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  redis.call('HDEL', KEYS[4], id)
end
redis.call('HINCRBY', KEYS[5], 'purged', #ids)
return #ids
