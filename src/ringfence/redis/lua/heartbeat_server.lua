#!lua flags=allow-oom
-- heartbeat_server: a worker's entry in the server registry. Bounded (one entry per live worker, replaced on
-- every beat) so it runs at maxmemory, and without a TTL, which a volatile-* policy would evict when full.
-- KEYS[1] servers      zset  server id -> heartbeat expiry ms
-- KEYS[2] server_info  hash  server id -> JSON info
-- KEYS[3] queues       set   every queue name ever used (re-registered: survives a flush of the set)
-- ARGV[1] server id  ARGV[2] info JSON  ARGV[3] ttl ms  ARGV[4] now ms  ARGV[5..] queue names
-- Returns: how many expired entries (workers that died without unregistering) were removed.
local now = tonumber(ARGV[4])
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 100)
for _, id in ipairs(gone) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
for i = 5, #ARGV do redis.call('SADD', KEYS[3], ARGV[i]) end
return #gone
