#!lua flags=allow-oom
-- fetch: take up to N ready jobs and lease them to one attempt.
-- KEYS[1] pending   list
-- KEYS[2] jobs      hash  id -> spec
-- KEYS[3] active    zset  id -> lease deadline ms
-- KEYS[4] lease     hash  id -> token
-- KEYS[5] attempts  hash  id -> attempts started
-- KEYS[6] paused    string, exists while paused
-- KEYS[7] stats     hash  counters ('dangling': queued ids that had no record; 'duplicates': second copies of an
--                         inline job, from an enqueue retried after its reply was lost; 'keyed_waiting': jobs in
--                         the concurrency keys' lists)
-- KEYS[8] idle      zset  worker -> sleeping-until ms (only read with ARGV[4])
-- ARGV[1] lease deadline ms
-- ARGV[2] max jobs
-- ARGV[3] lease token of this fetch (unique per call)
-- ARGV[4] optional: the fetching worker's id. The idle mark then moves with the fetch instead of costing round
--         trips of its own: a worker left with free slots by a queue now empty (or paused) is marked idle in
--         it until ARGV[5] (enqueue publishes a wake-up while a mark is live), else its mark is removed.
-- ARGV[5] idle mark until ms (with ARGV[4])
-- ARGV[6] now ms (with ARGV[4]): marks of workers that died asleep end before it, slots of keys end before it
-- KEYS[9] idle_lease hash worker -> lease ms (with ARGV[4]): enqueue_ready.lua leases pushed jobs for that long
-- ARGV[7..] (with ARGV[4]) pairs key, holder ('<job id>:<lease token>'): slots of concurrency keys whose jobs
--           this worker ended, freed first (as release_key_slots.lua frees them), so this fetch may take them
-- KEYS[10] prefix of the queue's concurrency-key keys (lua/_keyed.lua): a job whose spec names a key goes to
--          its key's list, and jobs are then leased from the keys in turn, within each key's limit
-- A pending entry is an id, whose spec is in jobs, or '<id><spec>' (a spec starts with '{', an id never holds
-- one): an inline job, whose spec moves into jobs here, so a leased job has the same keys whichever way it came.
-- Returns: flat list id, spec, attempt, ... (empty when paused or nothing is ready); a queued id without a
-- record is dropped, counted, and returned as id, '', 0 so the worker logs it. An inline entry whose id is in
-- jobs already is a second copy of a job queued or running: dropped, counted, not returned. With ARGV[4] one
-- more element ends the list: 1 when the queue was left empty (or is paused), else 0.
local worker = ARGV[4]

-- With a worker id: mark it idle or busy, and append whether the queue is empty now.
local function done(out, leased, empty, paused)
  if not worker then return out end
  if empty and leased < tonumber(ARGV[2]) then
    local gone = redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', ARGV[6])
    if #gone > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', ARGV[6]) end
    for _, w in ipairs(gone) do redis.call('HDEL', KEYS[9], w) end
    redis.call('ZADD', KEYS[8], ARGV[5], worker)
    if paused then  -- woken, never pushed a job, while paused
      redis.call('HDEL', KEYS[9], worker)
    else
      redis.call('HSET', KEYS[9], worker, tonumber(ARGV[1]) - tonumber(ARGV[6]))
    end
  else
    redis.call('ZREM', KEYS[8], worker)
  end
  out[#out + 1] = empty and 1 or 0
  return out
end

--@include keyed
local max, pfx = tonumber(ARGV[2]), KEYS[10]
if #ARGV >= 7 then free_slots(pfx, ARGV, 7) end
if redis.call('EXISTS', KEYS[6]) == 1 then return done({}, 0, true, true) end
local out, duplicates = {}, 0

-- The spec of a pending entry (nil: a queued id without a record) and the id.
local function entry_spec(entry)
  local at = string.find(entry, '{', 1, true)
  if at then return string.sub(entry, 1, at - 1), string.sub(entry, at), true end
  return entry, redis.call('HGET', KEYS[2], entry), false
end

-- Lease one pending entry; returns its id if a job was leased (take_turns then takes its key's slot).
local function lease(entry)
  local id, spec, inline = entry_spec(entry)
  if inline and redis.call('HSETNX', KEYS[2], id, spec) == 0 then
    duplicates = duplicates + 1  -- a second copy: dropped, counted below
    return nil
  end
  if not spec then
    redis.call('HINCRBY', KEYS[7], 'dangling', 1)
    out[#out + 1] = id
    out[#out + 1] = ''
    out[#out + 1] = 0
    return nil
  end
  local n = redis.call('HINCRBY', KEYS[5], id, '1')
  redis.call('ZADD', KEYS[3], ARGV[1], id)
  redis.call('HSET', KEYS[4], id, ARGV[3])
  out[#out + 1] = id
  out[#out + 1] = spec
  out[#out + 1] = n
  return id
end

local keyed = redis.call('EXISTS', pfx .. 'ring', pfx .. 'parked') > 0
-- Without keyed jobs waiting, entries are leased in queue order; a keyed one found goes to its key's list (a job
-- ready at enqueue is put there by enqueue_ready.lua; one queued later, or by enqueue.lua, is found here).
-- With them, a bounded batch of pending is sorted into the keys' lists first (plain entries to key ''), so a
-- backlog of one key is passed over in a few calls, not one job at a time.
local function take(n)
  local entries = redis.call('RPOP', KEYS[1], n) or {}
  local groups = new_groups()
  for _, entry in ipairs(entries) do
    -- an inline entry's id holds neither ',"ck":"' nor ',"a":': its key is read in place, no substring made
    local spec = string.find(entry, '{', 1, true) and entry or redis.call('HGET', KEYS[2], entry)
    local key, limit = nil, nil
    if spec then key, limit = entry_key(spec) end
    if key or keyed then
      group(groups, key or '', limit, entry)
      keyed = true
    else
      lease(entry)
    end
  end
  sort(pfx, KEYS[7], groups)
  return #entries
end
local batch = math.max(max, 1000)
local empty  -- pending is empty when a pop took fewer entries than it asked for
if keyed then
  empty = take(batch) < batch
else
  local got = take(max)
  empty = got < max
  if got == max and keyed and batch > max then  -- keyed jobs found: sort on as far as a keyed call would
    empty = take(batch - max) < batch - max
  end
end
empty = empty or redis.call('LLEN', KEYS[1]) == 0
if keyed then
  local now = ARGV[6]  -- a string: a Lua number passed to redis.call is formatted anew each time
  if not now then
    local t = redis.call('TIME')
    now = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  end
  local ringed = take_turns(pfx, KEYS[7], max - #out / 3, now, ARGV[1], ARGV[3], lease)
  empty = empty and not ringed and redis.call('LLEN', pfx .. 'ring') == 0
end
if duplicates > 0 then redis.call('HINCRBY', KEYS[7], 'duplicates', duplicates) end
return done(out, #out / 3, empty)
