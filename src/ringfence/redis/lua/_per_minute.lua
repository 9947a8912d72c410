-- Joined into the scripts that count finished or failed jobs (scripts.py '--@include per_minute').
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
