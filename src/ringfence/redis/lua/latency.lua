#!lua flags=allow-oom
-- latency: a worker's sample of a queue's latency (age of its oldest pending job) for the dashboard's charts;
-- the minute keeps the largest sample. Bounded like the counts ack/retry/dead keep in the same hash.
-- KEYS[1] minutes hash  (l<minute> -> ms)
-- ARGV[1] now ms  ARGV[2] latency ms
-- Returns: 1
local m = math.floor(tonumber(ARGV[1]) / 60000)
local field = 'l' .. m
local had = redis.call('HGET', KEYS[1], field)
if had and tonumber(had) >= tonumber(ARGV[2]) then return 1 end
redis.call('HSET', KEYS[1], field, ARGV[2])
if not had then
  redis.call('PEXPIRE', KEYS[1], 90000000)
  if redis.call('HLEN', KEYS[1]) > 4400 then
    for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
      if (tonumber(string.sub(f, 2)) or 0) < m - 1440 then redis.call('HDEL', KEYS[1], f) end
    end
  end
end
return 1
