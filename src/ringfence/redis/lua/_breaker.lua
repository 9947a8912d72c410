-- Joined into breaker_allow.lua and breaker_record.lua (scripts.py '--@include breaker').
-- move: breaker hash b goes from state `from` to `to` at now ms; the transition is logged in list log, newest
-- first, the last 50 kept. Returns `to`.
local function move(b, log, from, to, now)
  redis.call('HSET', b, 'state', to, 'changed_ms', now)
  redis.call('LPUSH', log, from .. '>' .. to .. '@' .. now)
  redis.call('LTRIM', log, 0, 49)
  return to
end
