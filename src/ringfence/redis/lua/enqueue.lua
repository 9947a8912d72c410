#!lua
-- enqueue: add jobs that are not there yet; run now (pending) or later (scheduled); optional unique keys.
-- KEYS[1] jobs        hash  id -> spec
-- KEYS[2] pending     list
-- KEYS[3] scheduled   zset  id -> run-at ms
-- KEYS[4] idle        zset  worker -> sleeping-until ms
-- KEYS[5] stats       hash  counters
-- KEYS[6] unique      hash  unique key -> id of the job holding it
-- KEYS[7] unique_exp  zset  unique key -> ms when the hold ends
-- ARGV[1] now ms
-- ARGV[2] wake channel
-- ARGV[3..] groups of 5: id, spec JSON, run-at ms (0 = now), unique key ('' = none), unique hold end ms
-- Returns: per job 1 (added; also when the id holds this very spec: a retried call whose first reply was
-- lost), 0 (the id existed with another spec: enqueue by id is idempotent) or the id of the queued or
-- running job that holds the unique key.
local now = tonumber(ARGV[1])
--@include add_job
-- Check every argument before the first write: a script that fails half-way keeps its writes, and a job
-- stored but never queued would never run.
for i = 3, #ARGV, 5 do
  if not tonumber(ARGV[i + 2]) or not tonumber(ARGV[i + 4]) then
    return redis.error_reply('enqueue: run-at and hold end of job ' .. ARGV[i] .. ' must be numbers')
  end
end
forget_stale_holds(now)
local out, added, ready = {}, 0, 0
for i = 3, #ARGV, 5 do
  local answer, went = add_job(ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3], ARGV[i + 4], now)
  out[#out + 1] = answer
  if went then added = added + 1 end
  if went == 'ready' then ready = ready + 1 end
end
added_jobs(added, ready, now, ARGV[2])
return out
