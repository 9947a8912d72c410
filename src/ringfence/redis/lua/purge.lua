#!lua flags=allow-oom
-- purge: delete up to ARGV[1] of a queue's pending jobs, oldest first (one bounded batch per call).
-- The caller first moves pending jobs that own a fence step past capture to dead-letter (cancel.lua).
-- KEYS[1] pending list  KEYS[2] jobs hash  KEYS[3] attempts hash  KEYS[4] history hash  KEYS[5] stats hash
-- ARGV[1] max jobs
-- Returns: how many jobs were deleted. An inline entry ('<id><spec>') has no record in the hashes: it never
-- ran, and a copy of a job that is running keeps that job's record.
local entries = redis.call('RPOP', KEYS[1], tonumber(ARGV[1]))
if not entries then return 0 end
for _, id in ipairs(entries) do
  if not string.find(id, '{', 1, true) then
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
  end
end
redis.call('HINCRBY', KEYS[5], 'purged', #entries)
return #entries
