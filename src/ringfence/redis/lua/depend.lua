#!lua flags=allow-oom
-- depend: add one job that runs once its dependencies (jobs of the same queue) are acked (lua/_depends.lua).
-- KEYS[1] jobs  KEYS[2] pending  KEYS[3] dead  KEYS[4] dead_jobs  KEYS[5] stats  KEYS[6] waiters  KEYS[7] waiting
-- KEYS[8] idle
-- ARGV[1] now ms  ARGV[2] wake channel  ARGV[3] id  ARGV[4] spec
-- ARGV[5..] pairs: dependency id, its inline pending entry as the caller found it ('' if none)
-- A dependency still in the queue (a record in jobs, or its inline entry still pending) is waited for; one in
-- dead-letter decides the job at once (dead-letter, reason dependency_dead); one in neither finished already.
-- 'enqueued' counts the job when it enters pending (here, or in the ack that releases it).
-- Returns: {'waiting', dependencies...}, {'queued'}, {'dead', dependency}, or {'exists'} when the id is taken.
--@include depends
local now, id, spec = ARGV[1], ARGV[3], ARGV[4]
local held = redis.call('HGET', KEYS[1], id)
if held then return {held == spec and 'same' or 'exists'} end
local left = {}
for i = 5, #ARGV, 2 do
  local dep = ARGV[i]
  if redis.call('ZSCORE', KEYS[3], dep) then
    local rec = redis.call('HGET', KEYS[4], dep)
    local err = 'dependency ' .. dep .. ' is dead (' .. tostring(rec and cjson.decode(rec).reason) .. ')'
    redis.call('HSET', KEYS[4], id, '{"spec":' .. cjson.encode(spec) .. ',"attempts":0,"history":"[]","died_ms":'
      .. now .. ',"reason":"dependency_dead","error":' .. cjson.encode(err) .. '}')
    redis.call('ZADD', KEYS[3], now, id)
    redis.call('HINCRBY', KEYS[5], 'dead', 1)
    return {'dead', dep}
  end
  if redis.call('HEXISTS', KEYS[1], dep) == 1 or (ARGV[i + 1] ~= '' and redis.call('LPOS', KEYS[2], ARGV[i + 1])) then
    left[#left + 1] = dep
  end
end
redis.call('HSET', KEYS[1], id, spec)
if #left == 0 then
  redis.call('LPUSH', KEYS[2], id)
  redis.call('HINCRBY', KEYS[5], 'enqueued', 1)
  if redis.call('ZCOUNT', KEYS[8], now, '+inf') > 0 then redis.call('PUBLISH', ARGV[2], 1) end
  return {'queued'}
end
redis.call('HSET', KEYS[7], id, table.concat(left, ','))
for _, dep in ipairs(left) do
  local ws = redis.call('HGET', KEYS[6], dep)
  redis.call('HSET', KEYS[6], dep, ws and (ws .. ',' .. id) or id)
end
table.insert(left, 1, 'waiting')
return left
