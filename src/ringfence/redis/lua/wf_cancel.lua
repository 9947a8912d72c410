#!lua flags=allow-oom
-- wf_cancel: cancel a workflow: no step waiting is queued any more; it expires after its ttl.
-- KEYS[1] workflow  hash
-- Returns: {1, the job ids of the steps queued (not finished), the indexes of the steps being handed over to
-- another queue}, for the caller to cancel or block one by one (workflows.py); {0} when there is no such workflow.
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {0} end
if state == 'running' or state == 'failed' then redis.call('HSET', KEYS[1], 'state', 'cancelled') end
redis.call('PEXPIRE', KEYS[1], redis.call('HGET', KEYS[1], 'ttl'))
local queued, handing = {}, {}
for i = 0, tonumber(redis.call('HGET', KEYS[1], 'n')) - 1 do
  local s = redis.call('HGET', KEYS[1], 's' .. i)
  if s == 'queued' then queued[#queued + 1] = redis.call('HGET', KEYS[1], 'j' .. i) end
  if s == 'handing' then handing[#handing + 1] = tostring(i) end
end
return {1, queued, handing}
