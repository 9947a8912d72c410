#!lua flags=allow-oom
-- dead: move a job to dead-letter with its spec, attempts, history and the reason.
-- KEYS[1] active     zset
-- KEYS[2] lease      hash  id -> token
-- KEYS[3] jobs       hash  id -> spec
-- KEYS[4] attempts   hash
-- KEYS[5] history    hash
-- KEYS[6] dead       zset  id -> died ms
-- KEYS[7] dead_jobs  hash  id -> record JSON
-- KEYS[8] stats      hash
-- KEYS[9] durable    zset  id -> died ms: the failed_jobs row is owed (worker/durable.py)
-- KEYS[10] minutes   hash  per-minute counts (f<minute>: failed attempts)
-- ARGV[1] id  ARGV[2] token  ARGV[3] now ms  ARGV[4] last history entry JSON
-- ARGV[5] record fields JSON object (reason, error, traceback, ...)
-- ARGV[6] 1 when a failed_jobs row will be written for this job, else 0
-- KEYS[11] waiters  KEYS[12] waiting: jobs waiting for this one go to dead-letter too (lua/_depends.lua)
-- A workflow step also has KEYS[13] pending, KEYS[14] idle, KEYS[15] workflow hash and ARGV[7] step index,
-- ARGV[8] the failure as its dependents may see it (JSON), ARGV[9] wake channel: the workflow learns of the death
-- in this call (failed, or its dependents queued under a chord's 'continue' policy); KEYS[16] its hand-over zset
-- (lua/_workflow.lua: a dependent of another queue is handed over by the sweep). A step of another queue than its
-- workflow's has KEYS[13] back, KEYS[14] back_data and ARGV[7] its completion entry instead: its death is
-- recorded in its own slot, for the worker (or the sweep) to apply to the workflow (lua/wf_apply.lua).
-- Returns: 1, or 0 when this attempt no longer held the lease.
--@include per_minute
--@include workflow
--@include depends
local id = ARGV[1]
if redis.call('HGET', KEYS[2], id) ~= ARGV[2] then return 0 end
local spec = redis.call('HGET', KEYS[3], id)
if not spec then return 0 end
local n = redis.call('HGET', KEYS[4], id) or '0'
local hist = redis.call('HGET', KEYS[5], id)
if hist then
  hist = string.sub(hist, 1, -2) .. ',' .. ARGV[4] .. ']'
else
  hist = '[' .. ARGV[4] .. ']'
end
-- spec and history are stored as JSON strings so replay restores them byte for byte.
local record = '{"spec":' .. cjson.encode(spec) .. ',"attempts":' .. n .. ',"history":' .. cjson.encode(hist)
  .. ',"died_ms":' .. ARGV[3] .. ',' .. string.sub(ARGV[5], 2)
redis.call('HSET', KEYS[7], id, record)
redis.call('ZADD', KEYS[6], ARGV[3], id)
if ARGV[6] == '1' then redis.call('ZADD', KEYS[9], ARGV[3], id) end
redis.call('ZREM', KEYS[1], id)
redis.call('HDEL', KEYS[2], id)
redis.call('HDEL', KEYS[3], id)
redis.call('HDEL', KEYS[4], id)
redis.call('HDEL', KEYS[5], id)
redis.call('HINCRBY', KEYS[8], 'dead', 1)
redis.call('HINCRBY', KEYS[8], 'failed', 1)
per_minute(KEYS[10], 'f', ARGV[3], 1)
local reason = cjson.decode(ARGV[5]).reason
deps_dead(KEYS[11], KEYS[12], KEYS[3], KEYS[6], KEYS[7], KEYS[8], id, ARGV[3], 'is dead (' .. tostring(reason) .. ')')
if KEYS[15] then
  woke(step_dead(KEYS[15], ARGV[7], ARGV[8], ARGV[3], KEYS[3], KEYS[13], KEYS[16]), KEYS[14], tonumber(ARGV[3]),
    ARGV[9], KEYS[8])
elseif KEYS[14] then
  redis.call('ZADD', KEYS[13], ARGV[3], id)
  redis.call('HSET', KEYS[14], id, ARGV[7])
end
return 1
