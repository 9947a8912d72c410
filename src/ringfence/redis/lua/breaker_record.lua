#!lua flags=allow-oom
-- breaker_record: the outcome of a job that ran against the dependency.
-- KEYS[1] breaker      hash (see breaker_allow.lua)
-- KEYS[2] transitions  list
-- KEYS[3] failures     zset  failure id -> ms
-- ARGV[1] now ms  ARGV[2] 1 = success, 0 = failure  ARGV[3] failures that open the circuit
-- ARGV[4] window ms  ARGV[5] open ms  ARGV[6] unique failure id
-- Returns: the state after recording.
local now = tonumber(ARGV[1])
local b = KEYS[1]
local state = redis.call('HGET', b, 'state') or 'closed'
--@include breaker
if ARGV[2] == '1' then
  if state == 'half_open' then
    state = move(b, KEYS[2], state, 'closed', now)
    redis.call('DEL', KEYS[3])
  end
  return state
end
if state == 'half_open' then
  state = move(b, KEYS[2], state, 'open', now)
  redis.call('HSET', b, 'open_until', now + tonumber(ARGV[5]))
  return state
end
if state == 'closed' then
  redis.call('ZADD', KEYS[3], now, ARGV[6])
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[4]))
  if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[3]) then
    state = move(b, KEYS[2], state, 'open', now)
    redis.call('HSET', b, 'open_until', now + tonumber(ARGV[5]))
    redis.call('DEL', KEYS[3])
  end
end
return state
