#!lua flags=allow-oom
-- wf_ack: a workflow step of another queue than its workflow's finished: ack it and, in the same call, record
-- its completion in its own slot (back, back_data), for the worker (or the sweep) to apply to the workflow in the
-- workflow's slot (wf_apply.lua), then forget (wf_back_done.lua).
-- KEYS[1] active  KEYS[2] lease  KEYS[3] jobs  KEYS[4] attempts  KEYS[5] history  KEYS[6] stats
-- KEYS[7] minutes  KEYS[8] pending  KEYS[9] idle  KEYS[10] waiters  KEYS[11] waiting (as advance.lua)
-- KEYS[12] back       zset  id -> ms its completion was recorded
-- KEYS[13] back_data  hash  id -> its completion entry (redis/workflows.py)
-- ARGV[1] now ms  ARGV[2] wake channel  ARGV[3] id  ARGV[4] token  ARGV[5] completion entry
-- Returns: the jobs queued (depends_on on this step), or -1 when this attempt no longer held the lease.
--@include workflow
--@include depends
--@include per_minute
--@include ack_step
local id, now = ARGV[3], tonumber(ARGV[1])
if not ack_step(id, ARGV[4], now) then return -1 end
redis.call('ZADD', KEYS[12], now, id)
redis.call('HSET', KEYS[13], id, ARGV[5])
local queued = deps_done(KEYS[10], KEYS[11], KEYS[8], {id})
woke(queued, KEYS[9], now, ARGV[2], KEYS[6])
return queued
