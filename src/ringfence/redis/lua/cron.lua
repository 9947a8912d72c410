#!lua
-- cron: enqueue the due ticks of one periodic task, each exactly once however many schedulers run.
-- KEYS[1] jobs     hash  id -> spec
-- KEYS[2] pending  list
-- KEYS[3] idle     zset
-- KEYS[4] stats    hash
-- KEYS[5] cron     hash  periodic name -> last tick ms handled
-- ARGV[1] now ms  ARGV[2] wake channel  ARGV[3] periodic name
-- ARGV[4] tick ms to mark handled even when not enqueued (missed ticks skipped by the catch-up mode; 0 = none)
-- ARGV[5..] triples, ascending ticks: tick ms, job id, spec JSON
-- Returns: the ticks enqueued by this call.
--@include allowed
-- Commands (ACL) checked before the first write: a tick stored but not queued would never run.
local denied = allowed('cron', {
  {'HGET', KEYS[5], 'name'}, {'HSET', KEYS[5], 'name', '0'}, {'HSETNX', KEYS[1], 'id', 'spec'},
  {'LPUSH', KEYS[2], 'id'}, {'HINCRBY', KEYS[4], 'enqueued', '1'}, {'ZCOUNT', KEYS[3], '0', '0'},
  {'PUBLISH', ARGV[2], '1'}})
if denied then return denied end
local last = tonumber(redis.call('HGET', KEYS[5], ARGV[3]) or '0')
local out = {}
for i = 5, #ARGV, 3 do
  local tick = tonumber(ARGV[i])
  if tick > last then
    if redis.call('HSETNX', KEYS[1], ARGV[i + 1], ARGV[i + 2]) == 1 then
      redis.call('LPUSH', KEYS[2], ARGV[i + 1])
      out[#out + 1] = ARGV[i]
    end
    last = tick
  end
end
local skip = tonumber(ARGV[4])
if skip > last then last = skip end
redis.call('HSET', KEYS[5], ARGV[3], last)
if #out > 0 then
  redis.call('HINCRBY', KEYS[4], 'enqueued', #out)
  if redis.call('ZCOUNT', KEYS[3], tonumber(ARGV[1]), '+inf') > 0 then redis.call('PUBLISH', ARGV[2], #out) end
end
return out
