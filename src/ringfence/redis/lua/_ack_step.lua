-- Joined into advance.lua and wf_ack.lua (after per_minute): the ack of a workflow step's job, on their shared
-- KEYS[1..7] (active, lease, jobs, attempts, history, stats, minutes). False, with nothing done, when this
-- attempt (token) no longer holds the job's lease.
local function ack_step(id, token, now)
  if redis.call('HGET', KEYS[2], id) ~= token then return false end
  redis.call('ZREM', KEYS[1], id)
  for k = 2, 5 do redis.call('HDEL', KEYS[k], id) end
  redis.call('HINCRBY', KEYS[6], 'processed', 1)
  per_minute(KEYS[7], 'p', now, 1)
  return true
end
