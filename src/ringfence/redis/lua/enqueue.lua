#!lua
-- enqueue: add jobs that are not there yet; run now (pending) or later (scheduled); optional unique keys.
-- KEYS[1] jobs        hash  id -> spec
-- KEYS[2] pending     list
-- KEYS[3] scheduled   zset  id -> run-at ms
-- KEYS[4] idle        zset  worker -> sleeping-until ms
-- KEYS[5] stats       hash  counters
-- KEYS[6] unique      hash  unique key -> id of the job holding it
-- KEYS[7] unique_exp  zset  unique key -> ms when the hold ends
-- ARGV[1] now ms
-- ARGV[2] wake channel
-- ARGV[3..] groups of 5: id, spec JSON, run-at ms (0 = now), unique key ('' = none), unique hold end ms
-- Returns: per job 1 (added; also when the id holds this very spec: a retried call whose first reply was
-- lost), 0 (the id existed with another spec: enqueue by id is idempotent) or the id of the queued or
-- running job that holds the unique key.
local now = tonumber(ARGV[1])
-- Check every argument before the first write: a script that fails half-way keeps its writes, and a job
-- stored but never queued would never run.
for i = 3, #ARGV, 5 do
  if not tonumber(ARGV[i + 2]) or not tonumber(ARGV[i + 4]) then
    return redis.error_reply('enqueue: run-at and hold end of job ' .. ARGV[i] .. ' must be numbers')
  end
end
-- Forget a few expired unique holds on each call: bounded work, no sweeper needed.
local stale = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', now, 'LIMIT', 0, 20)
for _, ukey in ipairs(stale) do
  redis.call('ZREM', KEYS[7], ukey)
  redis.call('HDEL', KEYS[6], ukey)
end
local out, added, ready = {}, 0, 0
for i = 3, #ARGV, 5 do
  local id, at, ukey = ARGV[i], tonumber(ARGV[i + 2]), ARGV[i + 3]
  local holder = false
  if ukey ~= '' then
    holder = redis.call('HGET', KEYS[6], ukey)
    if holder and (holder == id or redis.call('HEXISTS', KEYS[1], holder) == 0
        or tonumber(redis.call('ZSCORE', KEYS[7], ukey) or 0) <= now) then
      holder = false  -- the holder finished or its hold ended: the key is free
    end
  end
  if holder then
    out[#out + 1] = holder
  elseif redis.call('HSETNX', KEYS[1], id, ARGV[i + 1]) == 1 then
    if ukey ~= '' then
      redis.call('HSET', KEYS[6], ukey, id)
      redis.call('ZADD', KEYS[7], ARGV[i + 4], ukey)
    end
    if at > now then
      redis.call('ZADD', KEYS[3], at, id)
    else
      redis.call('LPUSH', KEYS[2], id)
      ready = ready + 1
    end
    added = added + 1
    out[#out + 1] = 1
  elseif redis.call('HGET', KEYS[1], id) == ARGV[i + 1] then
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
if added > 0 then redis.call('HINCRBY', KEYS[5], 'enqueued', added) end
if ready > 0 and redis.call('ZCOUNT', KEYS[4], now, '+inf') > 0 then
  redis.call('PUBLISH', ARGV[2], ready)
end
return out
