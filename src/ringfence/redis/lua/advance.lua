#!lua flags=allow-oom
-- advance: a workflow step's job finished: ack it and, in the same call, record its result and queue the steps
-- that waited for it (a crash cannot fall between the two).
-- KEYS[1] active    zset
-- KEYS[2] lease     hash  id -> token
-- KEYS[3] jobs      hash
-- KEYS[4] attempts  hash
-- KEYS[5] history   hash
-- KEYS[6] stats     hash
-- KEYS[7] minutes   hash  per-minute counts (p<minute>: processed)
-- KEYS[8] pending   list
-- KEYS[9] idle      zset
-- KEYS[10] workflow hash
-- KEYS[11] waiters  KEYS[12] waiting: jobs enqueued with depends_on on this step (lua/_depends.lua)
-- KEYS[13] out     zset  the workflow's steps handed over to other queues (lua/_workflow.lua)
-- ARGV[1] now ms  ARGV[2] wake channel  ARGV[3] id  ARGV[4] token  ARGV[5] step index  ARGV[6] result JSON
-- Returns: the steps queued (then the steps handed over to other queues, if any: index, queue, job id, spec
-- each), or -1 when this attempt no longer held the lease (nothing done).
--@include workflow
--@include depends
--@include per_minute
--@include ack_step
local id, now = ARGV[3], tonumber(ARGV[1])
if not ack_step(id, ARGV[4], now) then return -1 end
local queued = step_done(KEYS[10], ARGV[5], ARGV[6], ARGV[1], KEYS[3], KEYS[8], KEYS[13])
  + deps_done(KEYS[11], KEYS[12], KEYS[8], {id})
woke(queued, KEYS[9], now, ARGV[2], KEYS[6])
return with_handed(queued)
