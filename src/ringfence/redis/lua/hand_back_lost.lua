#!lua flags=allow-oom
-- hand_back_lost: a worker whose wake subscription was re-established gives back, at once, the jobs leased to it
-- by wake messages it never read (enqueue_ready.lua wrote the lease because PUBLISH counted the old connection).
-- A pushed lease names its holder: its token is '<worker>.p<id>.<attempt>' (enqueue_ready.lua). The worker calls this with its idle
-- marks removed and its subscription read up to a PING sent after that: no message can be on its way to it, so
-- every pushed lease in its name whose token it does not hold (ARGV[4..]: the pushed jobs it read and has not
-- finished) was lost with the old connection. Each goes back to the head of the queue, its attempt not counted,
-- as requeue.lua gives a job back. Reads the whole lease hash: run once per re-established subscription only.
-- KEYS[1] active   zset  id -> lease deadline ms
-- KEYS[2] lease    hash  id -> token
-- KEYS[3] attempts hash  id -> attempts started
-- KEYS[4] pending  list
-- KEYS[5] stats    hash  counters ('handed_back')
-- KEYS[6] idle     zset  worker -> sleeping-until ms
-- ARGV[1] '<worker>.p': the prefix of the tokens of jobs pushed to this worker
-- ARGV[2] now ms  ARGV[3] wake channel
-- ARGV[4..] tokens the worker holds (never handed back)
-- Returns: the ids handed back.
local prefix = ARGV[1]
local held = {}
for i = 4, #ARGV do held[ARGV[i]] = true end
local out = {}
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local id, token = all[i], all[i + 1]
  -- the exact pushed token (a prefix alone could match another worker's fetch token)
  if string.sub(token, 1, #prefix) == prefix and not held[token]
      and token == prefix .. id .. '.' .. (redis.call('HGET', KEYS[3], id) or '') then
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    if redis.call('HINCRBY', KEYS[3], id, -1) <= 0 then redis.call('HDEL', KEYS[3], id) end
    redis.call('RPUSH', KEYS[4], id)
    out[#out + 1] = id
  end
end
if #out > 0 then
  redis.call('HINCRBY', KEYS[5], 'handed_back', #out)
  if redis.call('ZCOUNT', KEYS[6], ARGV[2], '+inf') > 0 then redis.call('PUBLISH', ARGV[3], #out) end
end
return out
