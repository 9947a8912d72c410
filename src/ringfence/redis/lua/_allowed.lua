-- Joined into the scripts that add jobs (scripts.py '--@include allowed').
-- A command the Redis user may not run (ACL) fails inside a script after the writes before it were made: a job
-- stored but never queued. allowed() asks Redis up front for every command (and key or channel) a call may run,
-- and returns the error to reply with, naming the first one refused, before any write. Redis < 7 cannot ask.
local function allowed(what, checks)
  if not redis.acl_check_cmd then return nil end
  for _, c in ipairs(checks) do
    if not redis.acl_check_cmd(unpack(c)) then
      return redis.error_reply('NOPERM ' .. what .. ' refused before any write: this Redis user may not run ' ..
        c[1] .. ' on ' .. c[2] .. ' (ACL); grant it, see docs/deployment.md')
    end
  end
  return nil
end
