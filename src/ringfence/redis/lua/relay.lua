#!lua
-- relay: the outbox relay's enqueue. As enqueue.lua, plus a record of the ids the relay sent: an id sent
-- before is refused, even after its job ran and was forgotten, so a relay that died between sending a row
-- and deleting it sends it again harmlessly.
-- KEYS[1] jobs        hash  id -> spec
-- KEYS[2] pending     list
-- KEYS[3] scheduled   zset  id -> run-at ms
-- KEYS[4] idle        zset  worker -> sleeping-until ms
-- KEYS[5] stats       hash  counters (enqueued, outbox_refused)
-- KEYS[6] unique      hash  unique key -> id of the job holding it
-- KEYS[7] unique_exp  zset  unique key -> ms when the hold ends
-- KEYS[8] sent        zset  id -> ms the relay sent it (removed by the relay once its row is gone from the
--                           database, never while the row is there)
-- ARGV[1] now ms
-- ARGV[2] wake channel
-- ARGV[3..] groups of 5: id, spec JSON, run-at ms (0 = now), unique key ('' = none), unique hold end ms
-- Returns: per job 1 (added, or the id holds this very spec), 0 (the id holds another job), 2 (sent before:
-- refused) or the id of the queued or running job that holds the unique key.
local now = tonumber(ARGV[1])
--@include add_job
--@include allowed
-- Arguments and commands (ACL) checked before the first write: a sent record without its job is never resent.
for i = 3, #ARGV, 5 do
  if not tonumber(ARGV[i + 2]) or not tonumber(ARGV[i + 4]) then
    return redis.error_reply('relay: run-at and hold end of job ' .. ARGV[i] .. ' must be numbers')
  end
end
local denied = allowed('relay', {
  {'ZSCORE', KEYS[8], 'id'}, {'ZADD', KEYS[8], '0', 'id'},
  {'HSETNX', KEYS[1], 'id', 'spec'}, {'HGET', KEYS[1], 'id'}, {'HEXISTS', KEYS[1], 'id'}, {'LPUSH', KEYS[2], 'id'},
  {'ZADD', KEYS[3], '0', 'id'}, {'ZCOUNT', KEYS[4], '0', '0'}, {'HINCRBY', KEYS[5], 'enqueued', '1'},
  {'HGET', KEYS[6], 'key'}, {'HSET', KEYS[6], 'key', 'id'}, {'HDEL', KEYS[6], 'key'},
  {'ZRANGEBYSCORE', KEYS[7], '0', '0'}, {'ZSCORE', KEYS[7], 'key'}, {'ZADD', KEYS[7], '0', 'key'},
  {'ZREM', KEYS[7], 'key'}, {'PUBLISH', ARGV[2], '1'}})
if denied then return denied end
forget_stale_holds(now)
local out, added, ready, refused = {}, 0, 0, 0
for i = 3, #ARGV, 5 do
  local id = ARGV[i]
  if redis.call('ZSCORE', KEYS[8], id) then
    refused = refused + 1
    out[#out + 1] = 2
  else
    redis.call('ZADD', KEYS[8], now, id)
    local answer, went = add_job(id, ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3], ARGV[i + 4], now, -1)
    out[#out + 1] = answer
    if went then added = added + 1 end
    if went == 'ready' then ready = ready + 1 end
  end
end
if refused > 0 then redis.call('HINCRBY', KEYS[5], 'outbox_refused', refused) end
added_jobs(added, ready, now, ARGV[2])
return out
