#!lua flags=allow-oom
-- delete_dead: remove dead jobs for good (by id, or all older than a cutoff).
-- KEYS[1] dead zset  KEYS[2] dead_jobs hash
-- ARGV[1] cutoff ms (delete everything died at or before it; -1 = by id only)  ARGV[2] max by cutoff
-- ARGV[3..] ids
-- Returns: how many were deleted.
local n = 0
local cutoff = tonumber(ARGV[1])
if cutoff >= 0 then
  local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff, 'LIMIT', 0, tonumber(ARGV[2]))
  for _, id in ipairs(ids) do
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    n = n + 1
  end
end
for i = 3, #ARGV do
  n = n + redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('HDEL', KEYS[2], ARGV[i])
end
return n
