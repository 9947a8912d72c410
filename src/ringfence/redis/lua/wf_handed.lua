#!lua flags=allow-oom
-- wf_handed: a step handed over is in its queue (or blocked there by a cancel): its hand-over entry is closed.
-- KEYS[1] workflow hash  KEYS[2] out zset
-- ARGV[1] '<workflow id>:<step>'  ARGV[2] step  ARGV[3] 1: it went in (queued), 0: blocked (waiting)
-- Returns: 1.
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('HGET', KEYS[1], 's' .. ARGV[2]) == 'handing' then
  redis.call('HSET', KEYS[1], 's' .. ARGV[2], ARGV[3] == '1' and 'queued' or 'waiting')
  redis.call('HDEL', KEYS[1], 'o' .. ARGV[2])
end
return 1
