#!lua flags=allow-oom
-- purge: delete up to ARGV[1] of a queue's pending jobs, oldest first (one bounded batch per call), then those
-- waiting in their concurrency keys' lists (lua/_keyed.lua), key by key.
-- The caller first moves pending jobs that own a fence step past capture to dead-letter (cancel.lua).
-- KEYS[1] pending list  KEYS[2] jobs hash  KEYS[3] attempts hash  KEYS[4] history hash  KEYS[5] stats hash
-- KEYS[6] waiters hash  KEYS[7] waiting hash  KEYS[8] dead zset  KEYS[9] dead_jobs hash: the jobs waiting for a
-- purged one (depends_on) go to dead-letter (lua/_depends.lua)
-- KEYS[10] prefix of the queue's concurrency-key keys: an emptied key leaves ring and parked, and
--          'keyed_waiting' drops by the jobs taken from the keys' lists
-- ARGV[1] max jobs  ARGV[2] now ms
-- Returns: how many jobs were deleted. An inline entry ('<id><spec>') has no record in the hashes: it never
-- ran, and a copy of a job that is running keeps that job's record.
--@include depends
local max, pfx = tonumber(ARGV[1]), KEYS[10]

local function drop(entries)
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
end

local entries = redis.call('RPOP', KEYS[1], max) or {}
drop(entries)
local n, keyed = #entries, 0
if n < max then
  local keys = redis.call('LRANGE', pfx .. 'ring', 0, -1)
  for _, key in ipairs(redis.call('ZRANGE', pfx .. 'parked', 0, -1)) do keys[#keys + 1] = key end
  for _, key in ipairs(keys) do
    if n >= max then break end
    local list = pfx .. 'q:' .. key
    local taken = redis.call('RPOP', list, max - n) or {}
    drop(taken)
    n, keyed = n + #taken, keyed + #taken
    if redis.call('LLEN', list) == 0 then
      redis.call('LREM', pfx .. 'ring', 0, key)
      redis.call('ZREM', pfx .. 'parked', key)
    end
  end
end
if keyed > 0 then redis.call('HINCRBY', KEYS[5], 'keyed_waiting', -keyed) end
if n > 0 then redis.call('HINCRBY', KEYS[5], 'purged', n) end
return n
