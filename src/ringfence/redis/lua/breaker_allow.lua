#!lua flags=allow-oom
-- breaker_allow: may a job of this dependency run now? Circuit state and rate limit, shared by all workers.
-- KEYS[1] breaker      hash  state (closed|open|half_open), open_until, probe_until, changed_ms, rate_window, rate_count
-- KEYS[2] transitions  list  "from>to@ms", newest first, capped
-- ARGV[1] now ms  ARGV[2] rate limit per second (0 = none)  ARGV[3] probe timeout ms
-- Returns: {1, 0, state} to run, or {0, wait ms, why} to wait (open, half_open probe in flight, rate_limited).
local now = tonumber(ARGV[1])
local b = KEYS[1]
local state = redis.call('HGET', b, 'state') or 'closed'
--@include breaker
if state == 'open' then
  local open_until = tonumber(redis.call('HGET', b, 'open_until') or '0')
  if now < open_until then return {0, open_until - now, 'open'} end
  state = move(b, KEYS[2], state, 'half_open', now)
  redis.call('HSET', b, 'probe_until', now + tonumber(ARGV[3]))
  return {1, 0, 'half_open'}  -- this caller is the probe
end
if state == 'half_open' then
  local probe_until = tonumber(redis.call('HGET', b, 'probe_until') or '0')
  if now < probe_until then return {0, math.max(100, probe_until - now), 'half_open'} end
  redis.call('HSET', b, 'probe_until', now + tonumber(ARGV[3]))  -- the last probe vanished: send another
  return {1, 0, 'half_open'}
end
local limit = tonumber(ARGV[2])
if limit > 0 then
  local window = math.floor(now / 1000)
  local count = 0
  if tonumber(redis.call('HGET', b, 'rate_window') or '-1') == window then
    count = tonumber(redis.call('HGET', b, 'rate_count') or '0')
  end
  if count >= limit then return {0, (window + 1) * 1000 - now, 'rate_limited'} end
  redis.call('HSET', b, 'rate_window', window, 'rate_count', count + 1)
end
return {1, 0, state}
