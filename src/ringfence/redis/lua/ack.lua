#!lua flags=allow-oom
-- ack: jobs finished; forget them.
-- KEYS[1] active    zset
-- KEYS[2] lease     hash  id -> token
-- KEYS[3] jobs      hash
-- KEYS[4] attempts  hash
-- KEYS[5] history   hash
-- KEYS[6] stats     hash
-- KEYS[7] minutes   hash  per-minute counts (p<minute>: processed)
-- ARGV[1] now ms, then pairs: id, token
-- Returns: ids whose lease this attempt no longer held (not acked: another attempt owns them).
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
local lost, done = {}, 0
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[2], id) == ARGV[i + 1] then
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
    done = done + 1
  else
    lost[#lost + 1] = id
  end
end
if done > 0 then
  redis.call('HINCRBY', KEYS[6], 'processed', done)
  per_minute(KEYS[7], 'p', ARGV[1], done)
end
return lost
