#!lua flags=allow-oom
-- cancel: take one job out of its queue before it runs (pending, scheduled, retrying) or while it runs.
-- A running job loses its lease: its worker's next heartbeat sees that and sets ctx.cancelled.
-- KEYS[1] pending list  KEYS[2] scheduled zset  KEYS[3] retry zset  KEYS[4] active zset  KEYS[5] lease hash
-- KEYS[6] jobs hash  KEYS[7] attempts hash  KEYS[8] history hash  KEYS[9] dead zset  KEYS[10] dead_jobs hash
-- KEYS[11] stats hash  KEYS[12] waiters hash  KEYS[13] waiting hash (jobs enqueued with depends_on: lua/_depends.lua)
-- ARGV[1] id  ARGV[2] now ms
-- ARGV[3] '' to delete the job, else a JSON object of dead record fields: the job goes to dead-letter instead
--         (a job that owns a fence step past capture must not vanish)
-- KEYS[14] prefix of the queue's concurrency-key keys (lua/_keyed.lua): a pending job in its key's list is
--          taken from there
-- ARGV[4] the job's inline pending entry '<id><spec>' as a scan found it (Admin.inline_entry), or ''
-- Returns: the state it was taken from (pending, scheduled, retry, active, waiting, or "waiting for its key's
-- slot: <key>" while its key is parked at its limit), or '' when it is no job of the queue. The jobs waiting
-- for it go to dead-letter (reason dependency_dead).
--@include depends
--@include keyed

-- Take entry (pending) out of its key's list; the state it left, or nil.
local function from_key(spec, entry)
  local key = entry_key(spec) or ''  -- once a queue holds keyed jobs, plain ones wait under key ''
  local parked = redis.call('ZSCORE', KEYS[14] .. 'parked', key)  -- its key at its limit (read before unkey)
  if not unkey(KEYS[14], KEYS[11], key, entry) then return nil end
  return parked and ("waiting for its key's slot: " .. key) or 'pending'
end
local id = ARGV[1]
local spec = redis.call('HGET', KEYS[6], id)
local state = ''
if spec then
  if redis.call('ZREM', KEYS[2], id) == 1 then state = 'scheduled'
  elseif redis.call('ZREM', KEYS[3], id) == 1 then state = 'retry'
  elseif redis.call('ZREM', KEYS[4], id) == 1 then state = 'active'
  elseif redis.call('LREM', KEYS[1], 0, id) > 0 then state = 'pending'
  elseif redis.call('HDEL', KEYS[13], id) == 1 then state = 'waiting'
  else state = from_key(spec, id) or ''
  end
  if state == '' then return '' end
  -- a second inline copy (an enqueue retried after a lost reply) would run once this record is gone
  redis.call('LREM', KEYS[1], 0, id .. spec)
elseif string.sub(ARGV[4], 1, #id + 1) == id .. '{' then  -- not fetched since the scan found it, if still there
  spec = string.sub(ARGV[4], #id + 1)
  if redis.call('LREM', KEYS[1], 0, ARGV[4]) > 0 then state = 'pending' else state = from_key(spec, ARGV[4]) end
  if not state then return '' end
else
  return ''
end
if ARGV[3] ~= '' then
  local n = redis.call('HGET', KEYS[7], id) or '0'
  local hist = redis.call('HGET', KEYS[8], id) or '[]'
  local record = '{"spec":' .. cjson.encode(spec) .. ',"attempts":' .. n .. ',"history":' .. cjson.encode(hist)
    .. ',"died_ms":' .. ARGV[2] .. ',' .. string.sub(ARGV[3], 2)
  redis.call('HSET', KEYS[10], id, record)
  redis.call('ZADD', KEYS[9], ARGV[2], id)
  redis.call('HINCRBY', KEYS[11], 'dead', 1)
end
redis.call('HDEL', KEYS[5], id)
redis.call('HDEL', KEYS[6], id)
redis.call('HDEL', KEYS[7], id)
redis.call('HDEL', KEYS[8], id)
redis.call('HINCRBY', KEYS[11], 'cancelled', 1)
deps_dead(KEYS[12], KEYS[13], KEYS[6], KEYS[9], KEYS[10], KEYS[11], id, ARGV[2], 'was cancelled')
return state
