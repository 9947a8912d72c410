#!lua flags=allow-oom
-- wf_apply: the completion of a step of another queue, recorded in its slot (wf_ack.lua, dead.lua), applied to
-- its workflow: as advance.lua or dead.lua would for a step of the workflow's queue. Once per outcome: a step done
-- (or dead) already is left alone, so a completion applied twice (the sweep after a crash) counts once.
-- KEYS[1] workflow hash  KEYS[2] jobs  KEYS[3] pending  KEYS[4] idle  KEYS[5] stats  KEYS[6] out (the home queue's)
-- ARGV[1] now ms  ARGV[2] wake channel  ARGV[3] step  ARGV[4] 'd' (done) or 'x' (dead)  ARGV[5] result or failure
-- Returns: the steps queued, then the steps handed over (as advance.lua).
--@include workflow
local wf, i = KEYS[1], ARGV[3]
if redis.call('HGET', wf, 's' .. i) == 'handing' then  -- it ran before its hand-over entry was closed
  redis.call('ZREM', KEYS[6], redis.call('HGET', wf, 'id') .. ':' .. i)
  redis.call('HSET', wf, 's' .. i, 'queued')
  redis.call('HDEL', wf, 'o' .. i)
end
local queued
if ARGV[4] == 'd' then
  queued = step_done(wf, i, ARGV[5], ARGV[1], KEYS[2], KEYS[3], KEYS[6])
else
  queued = step_dead(wf, i, ARGV[5], ARGV[1], KEYS[2], KEYS[3], KEYS[6])
end
woke(queued, KEYS[4], tonumber(ARGV[1]), ARGV[2], KEYS[5])
return with_handed(queued)
