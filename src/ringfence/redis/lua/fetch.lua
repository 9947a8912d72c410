#!lua flags=allow-oom
-- fetch: take up to N ready jobs and lease them to one attempt.
-- KEYS[1] pending   list
-- KEYS[2] jobs      hash  id -> spec
-- KEYS[3] active    zset  id -> lease deadline ms
-- KEYS[4] lease     hash  id -> token
-- KEYS[5] attempts  hash  id -> attempts started
-- KEYS[6] paused    string, exists while paused
-- KEYS[7] stats     hash  counters ('dangling': queued ids that had no record)
-- ARGV[1] lease deadline ms
-- ARGV[2] max jobs
-- ARGV[3] lease token of this fetch (unique per call)
-- Returns: flat list id, spec, attempt, ... (empty when paused or nothing is ready); a queued id without a
-- record is dropped, counted, and returned as id, '', 0 so the worker logs it.
if redis.call('EXISTS', KEYS[6]) == 1 then return {} end
local ids = redis.call('RPOP', KEYS[1], tonumber(ARGV[2]))
if not ids then return {} end
local out = {}
for _, id in ipairs(ids) do
  local spec = redis.call('HGET', KEYS[2], id)
  if spec then
    local n = redis.call('HINCRBY', KEYS[5], id, 1)
    redis.call('ZADD', KEYS[3], ARGV[1], id)
    redis.call('HSET', KEYS[4], id, ARGV[3])
    out[#out + 1] = id
    out[#out + 1] = spec
    out[#out + 1] = n
  else
    redis.call('HINCRBY', KEYS[7], 'dangling', 1)
    out[#out + 1] = id
    out[#out + 1] = ''
    out[#out + 1] = 0
  end
end
return out
