#!lua flags=allow-oom
-- purge: delete up to ARGV[1] of a queue's pending jobs, oldest first (one bounded batch per call).
-- The caller first moves pending jobs that own a fence step past capture to dead-letter (cancel.lua).
-- KEYS[1] pending list  KEYS[2] jobs hash  KEYS[3] attempts hash  KEYS[4] history hash  KEYS[5] stats hash
-- KEYS[6] waiters hash  KEYS[7] waiting hash  KEYS[8] dead zset  KEYS[9] dead_jobs hash: the jobs waiting for a
-- purged one (depends_on) go to dead-letter (lua/_depends.lua)
-- ARGV[1] max jobs  ARGV[2] now ms
-- Returns: how many jobs were deleted. An inline entry ('<id><spec>') has no record in the hashes: it never
-- ran, and a copy of a job that is running keeps that job's record.
--@include depends
local entries = redis.call('RPOP', KEYS[1], tonumber(ARGV[1]))
if not entries then return 0 end
for _, entry in ipairs(entries) do
  local brace = string.find(entry, '{', 1, true)
  local id = brace and string.sub(entry, 1, brace - 1) or entry
  if not brace then
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
  end
  deps_dead(KEYS[6], KEYS[7], KEYS[2], KEYS[8], KEYS[9], KEYS[5], id, ARGV[2], 'was purged')
end
redis.call('HINCRBY', KEYS[5], 'purged', #entries)
return #entries
