#!lua
-- wf_start: store a workflow and queue its first steps (those waiting on no other), once per workflow id.
-- KEYS[1] workflow  hash (redis/workflows.py lists its fields)
-- KEYS[2] jobs      hash  id -> spec
-- KEYS[3] pending   list
-- KEYS[4] idle      zset  worker -> sleeping-until ms
-- KEYS[5] stats     hash
-- KEYS[6] out       zset  '<workflow id>:<step>' -> ms: its steps of other queues handed over (lua/_workflow.lua)
-- ARGV[1] now ms  ARGV[2] wake channel  ARGV[3] steps  ARGV[4..] the workflow's fields: name, value pairs
-- Returns: 1, then the steps handed over to other queues (index, queue, job id, spec each), or 0 when the
-- workflow exists already (a retried call whose first reply was lost: the sweep hands its steps over).
--@include workflow
--@include allowed
local refused = allowed('workflow start', {
  {'HSET', KEYS[1], 'f', 'v'}, {'HSETNX', KEYS[2], 'id', 'spec'}, {'LPUSH', KEYS[3], 'id'},
  {'ZCOUNT', KEYS[4], '0', '0'}, {'HINCRBY', KEYS[5], 'enqueued', '1'}, {'PUBLISH', ARGV[2], '1'},
  {'ZADD', KEYS[6], '0', 'm'}})
if refused then return refused end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local now = tonumber(ARGV[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
local queued = 0
for i = 0, tonumber(ARGV[3]) - 1 do
  if redis.call('HGET', KEYS[1], 'w' .. i) == '0' then
    queued = queued + queue_step(KEYS[1], i, ARGV[1], KEYS[2], KEYS[3], KEYS[6])
  end
end
woke(queued, KEYS[4], now, ARGV[2], KEYS[5])
return with_handed(1)
