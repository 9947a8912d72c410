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
-- The keys of the acked jobs go in one variadic call per key and per 1000 jobs, not one call per job and key: a
-- script's redis.call costs Redis more than the deletion itself.
local lost, acked, seen = {}, {}, {}
for i = 2, #ARGV, 2 do
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
end
return lost
