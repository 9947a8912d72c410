#!lua flags=allow-oom
-- advance: a workflow step's job finished: ack it and, in the same call, record its result and queue the steps
-- that waited for it (a crash cannot fall between the two).
-- KEYS[1] active    zset
-- KEYS[2] lease     hash  id -> token
-- KEYS[3] jobs      hash
-- KEYS[4] attempts  hash
-- KEYS[5] history   hash
-- KEYS[6] stats     hash
-- KEYS[7] minutes   hash  per-minute counts (p<minute>: processed)
-- KEYS[8] pending   list
-- KEYS[9] idle      zset
-- KEYS[10] workflow hash
-- ARGV[1] now ms  ARGV[2] wake channel  ARGV[3] id  ARGV[4] token  ARGV[5] step index  ARGV[6] result JSON
-- Returns: the steps queued, or -1 when this attempt no longer held the lease (nothing done).
--@include workflow
-- per-minute counts for the dashboard's charts (field kind..minute); a day is kept, trimmed when a minute starts
local function per_minute(key, kind, now_ms, n)
  local m = math.floor(tonumber(now_ms) / 60000)
  if redis.call('HINCRBY', key, kind .. m, n) == n then
    redis.call('PEXPIRE', key, 90000000)
    if redis.call('HLEN', key) > 4400 then
      for _, f in ipairs(redis.call('HKEYS', key)) do
        if (tonumber(string.sub(f, 2)) or 0) < m - 1440 then redis.call('HDEL', key, f) end
      end
    end
  end
end
local id = ARGV[3]
if redis.call('HGET', KEYS[2], id) ~= ARGV[4] then return -1 end
local now = tonumber(ARGV[1])
redis.call('ZREM', KEYS[1], id)
for k = 2, 5 do redis.call('HDEL', KEYS[k], id) end
redis.call('HINCRBY', KEYS[6], 'processed', 1)
per_minute(KEYS[7], 'p', now, 1)
local queued = step_done(KEYS[10], ARGV[5], ARGV[6], ARGV[1], KEYS[3], KEYS[8])
woke(queued, KEYS[9], now, ARGV[2], KEYS[6])
return queued
