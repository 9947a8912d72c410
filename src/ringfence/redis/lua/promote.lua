#!lua flags=allow-oom
-- promote: move scheduled and retry jobs whose time has come to the queue.
-- KEYS[1] scheduled zset  KEYS[2] retry zset  KEYS[3] pending list  KEYS[4] idle zset
-- ARGV[1] now ms  ARGV[2] max jobs per set  ARGV[3] wake channel
-- Returns: how many jobs were moved.
local now, moved = tonumber(ARGV[1]), 0
for k = 1, 2 do
  local ids = redis.call('ZRANGEBYSCORE', KEYS[k], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
  if #ids > 0 then
    redis.call('ZREM', KEYS[k], unpack(ids))
    redis.call('LPUSH', KEYS[3], unpack(ids))
    moved = moved + #ids
  end
end
if moved > 0 and redis.call('ZCOUNT', KEYS[4], now, '+inf') > 0 then redis.call('PUBLISH', ARGV[3], moved) end
return moved
