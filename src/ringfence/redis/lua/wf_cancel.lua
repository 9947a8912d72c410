#!lua flags=allow-oom
-- wf_cancel: cancel a workflow: no step waiting is queued any more; it expires after its ttl.
-- KEYS[1] workflow  hash
-- Returns: the job ids of the steps queued (not finished), for the caller to cancel one by one (jobs.py); an
-- empty list with 0 first when there is no such workflow.
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {0} end
if state == 'running' or state == 'failed' then redis.call('HSET', KEYS[1], 'state', 'cancelled') end
redis.call('PEXPIRE', KEYS[1], redis.call('HGET', KEYS[1], 'ttl'))
local out = {1}
for i = 0, tonumber(redis.call('HGET', KEYS[1], 'n')) - 1 do
  if redis.call('HGET', KEYS[1], 's' .. i) == 'queued' then out[#out + 1] = redis.call('HGET', KEYS[1], 'j' .. i) end
end
return out
