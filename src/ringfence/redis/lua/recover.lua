#!lua flags=allow-oom
-- recover: return jobs whose lease has expired (their worker died or hung) to the head of the queue.
-- Safe to run from many workers at once: each expired id is moved by exactly one call.
-- KEYS[1] active   zset  id -> lease deadline ms
-- KEYS[2] lease    hash  id -> token
-- KEYS[3] pending  list
-- KEYS[4] history  hash  id -> JSON list
-- KEYS[5] attempts hash
-- KEYS[6] stats    hash
-- KEYS[7] idle     zset
-- ARGV[1] now ms  ARGV[2] max jobs  ARGV[3] wake channel
-- Returns: the recovered ids. The attempt stays counted; the history marks it orphaned.
local now = tonumber(ARGV[1])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  local entry = '{"attempt":' .. (redis.call('HGET', KEYS[5], id) or '0')
    .. ',"orphaned":true,"error":"lease expired: the worker died or stopped heartbeating","at":' .. now .. '}'
  local hist = redis.call('HGET', KEYS[4], id)
  if hist then
    hist = string.sub(hist, 1, -2) .. ',' .. entry .. ']'
  else
    hist = '[' .. entry .. ']'
  end
  redis.call('HSET', KEYS[4], id, hist)
  redis.call('RPUSH', KEYS[3], id)
end
if #ids > 0 then
  redis.call('HINCRBY', KEYS[6], 'orphaned', #ids)
  redis.call('HSET', KEYS[6], 'orphaned_last_ms', now)  -- the doctor: when the latest orphan happened
  if redis.call('ZCOUNT', KEYS[7], now, '+inf') > 0 then redis.call('PUBLISH', ARGV[3], #ids) end
end
return ids
