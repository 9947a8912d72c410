#!lua flags=allow-oom
-- ack: jobs finished; forget them.
-- KEYS[1] active    zset
-- KEYS[2] lease     hash  id -> token
-- KEYS[3] jobs      hash
-- KEYS[4] attempts  hash
-- KEYS[5] history   hash
-- KEYS[6] stats     hash
-- KEYS[7] minutes   hash  per-minute counts (p<minute>: processed)
-- KEYS[8] waiters  KEYS[9] waiting  KEYS[10] pending  KEYS[11] idle: jobs waiting for the acked ones are queued
-- ARGV[1] now ms, ARGV[2] wake channel, then pairs: id, token
-- Returns: ids whose lease this attempt no longer held (not acked: another attempt owns them).
--@include per_minute
--@include depends
-- The keys of the acked jobs go in one variadic call per key and per 1000 jobs, not one call per job and key: a
-- script's redis.call costs Redis more than the deletion itself.
local lost, acked, seen = {}, {}, {}
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  if not seen[id] and redis.call('HGET', KEYS[2], id) == ARGV[i + 1] then
    seen[id] = true  -- a second copy in the batch finds its lease gone, as it would have one by one
    acked[#acked + 1] = id
  else
    lost[#lost + 1] = id
  end
end
for i = 1, #acked, 1000 do
  local last = math.min(i + 999, #acked)
  redis.call('ZREM', KEYS[1], unpack(acked, i, last))
  for k = 2, 5 do redis.call('HDEL', KEYS[k], unpack(acked, i, last)) end
end
if #acked > 0 then
  redis.call('HINCRBY', KEYS[6], 'processed', #acked)
  per_minute(KEYS[7], 'p', ARGV[1], #acked)
  local queued = deps_done(KEYS[8], KEYS[9], KEYS[10], acked)
  if queued > 0 then
    redis.call('HINCRBY', KEYS[6], 'enqueued', queued)
    if redis.call('ZCOUNT', KEYS[11], ARGV[1], '+inf') > 0 then redis.call('PUBLISH', ARGV[2], queued) end
  end
end
return lost
