#!lua
-- replay: put dead jobs back in the queue under the same id, attempts reset.
-- KEYS[1] dead zset  KEYS[2] dead_jobs hash  KEYS[3] jobs hash  KEYS[4] pending list
-- KEYS[5] attempts hash  KEYS[6] history hash  KEYS[7] idle zset  KEYS[8] stats hash
-- ARGV[1] now ms  ARGV[2] wake channel  ARGV[3..] ids
-- Returns: the ids replayed (an id that is not dead, or is queued again already, is left alone).
local now, out = tonumber(ARGV[1]), {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local record = redis.call('HGET', KEYS[2], id)
  if record and redis.call('HEXISTS', KEYS[3], id) == 0 then
    redis.call('HSET', KEYS[3], id, cjson.decode(record)['spec'])
    redis.call('HDEL', KEYS[5], id)
    redis.call('HDEL', KEYS[6], id)
    redis.call('LPUSH', KEYS[4], id)
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    out[#out + 1] = id
  end
end
if #out > 0 then
  redis.call('HINCRBY', KEYS[8], 'replayed', #out)
  if redis.call('ZCOUNT', KEYS[7], now, '+inf') > 0 then redis.call('PUBLISH', ARGV[2], #out) end
end
return out
