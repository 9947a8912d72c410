-- Joined into fetch.lua (scripts.py '--@include keyed'): jobs with a concurrency key (tasks.py concurrency_key).
-- At most its limit of a key's jobs run at once, and fetch takes the keys in turn, so a key with a deep backlog
-- gets one job per turn and no more. Every key here starts with the prefix pfx (fetch.lua's KEYS[10]), in the
-- queue's slot:
--   pfx..'ring'      list  keys with jobs waiting that may run: RPOP the next, LPUSH it back behind the others
--   pfx..'parked'    zset  key -> ms to look again: keys at their limit with jobs waiting; release_key_slot.lua
--                          moves a key back to the ring, and the ms (its earliest slot's end) frees a dead worker's
--   pfx..'limit'     hash  key -> its limit (from the latest job's spec)
--   pfx..'q:'..key   list  the key's jobs waiting: pending entries as in pending (LPUSH, RPOP)
--   pfx..'s:'..key   zset  slots: holder (job id) -> slot lease end ms (extend_slots.lua renews them)
-- A key whose list is not empty is in exactly one of ring and parked. Once a queue holds keyed jobs, jobs without
-- a key go to key '' (no limit): they take their turn as one key.

-- The key and limit of a pending entry whose spec is spec, or nil. The spec's head holds ',"ck":"<key>","cl":<n>'
-- (client.py; a key has no quote or backslash); the payload ("a") comes last, so a "ck" inside it is not taken.
local function entry_key(spec)
  local at = string.find(spec, ',"ck":"', 1, true)
  if not at then return nil end
  local payload = string.find(spec, ',"a":', 1, true)
  if payload and payload < at then return nil end
  return string.match(spec, '^,"ck":"([^"]*)","cl":(%d+)', at)
end

-- Sort pending entries into their keys' lists: sorted[key] holds the key's entries in queue order (order: the
-- keys as first seen); a key joins the ring when its list was empty. The queue's stats count them in
-- 'keyed_waiting' (queries.py adds them to pending).
local function sort(pfx, stats, order, sorted, limits)
  local total = 0
  for _, key in ipairs(order) do
    total = total + #sorted[key]
    if limits[key] then redis.call('HSET', pfx .. 'limit', key, limits[key]) end
    local entries, list = sorted[key], pfx .. 'q:' .. key
    local n = 0
    for i = 1, #entries, 1000 do  -- unpack is bounded by Lua's C stack
      n = redis.call('LPUSH', list, unpack(entries, i, math.min(i + 999, #entries)))
    end
    if n == #entries then redis.call('LPUSH', pfx .. 'ring', key) end
  end
  if total > 0 then redis.call('HINCRBY', stats, 'keyed_waiting', total) end
end

-- Lease up to want jobs taking the ring's keys in turn (lease(entry, slots) leases one, returns 1 if it did).
-- A key at its limit is parked until its earliest slot ends or a release brings it back.
local function take_turns(pfx, stats, want, now, lease)
  local ring, parked = pfx .. 'ring', pfx .. 'parked'
  local due = redis.call('ZRANGEBYSCORE', parked, '-inf', now, 'LIMIT', 0, 100)
  for _, key in ipairs(due) do
    redis.call('ZREM', parked, key)
    redis.call('LPUSH', ring, key)
  end
  local known = {}  -- key -> {limit, slots held, slots key}, read once per call
  local got, taken, steps = 0, 0, want + 1000  -- steps bound one call's work when many keys are parked at once
  while got < want and steps > 0 do
    steps = steps - 1
    local key = redis.call('RPOP', ring)
    if not key then break end
    local k = known[key]
    if not k then
      local limit = key ~= '' and tonumber(redis.call('HGET', pfx .. 'limit', key))
      k = {limit = limit, held = 0}
      if limit then
        k.slots = pfx .. 's:' .. key
        redis.call('ZREMRANGEBYSCORE', k.slots, '-inf', now)
        k.held = redis.call('ZCARD', k.slots)
      end
      known[key] = k
    end
    local list = pfx .. 'q:' .. key
    if not k.limit or k.held < k.limit then
      local entry = redis.call('RPOP', list)
      if entry then
        taken = taken + 1
        local n = lease(entry, k.slots)
        got, k.held = got + n, k.held + n
      end
      if redis.call('LLEN', list) > 0 then redis.call('LPUSH', ring, key) end
    else
      local first = redis.call('ZRANGE', k.slots, 0, 0, 'WITHSCORES')
      redis.call('ZADD', parked, first[2], key)
    end
  end
  if taken > 0 then redis.call('HINCRBY', stats, 'keyed_waiting', -taken) end
end

-- Take one entry out of its key's list (cancel.lua, purge.lua), keeping 'keyed_waiting' and the rule that a key
-- with jobs waiting is in ring or parked and an empty one in neither. Returns true if the entry was there.
local function unkey(pfx, stats, key, entry)
  local list = pfx .. 'q:' .. key
  if redis.call('LREM', list, 1, entry) == 0 then return false end
  redis.call('HINCRBY', stats, 'keyed_waiting', -1)
  if redis.call('LLEN', list) == 0 then
    redis.call('LREM', pfx .. 'ring', 0, key)
    redis.call('ZREM', pfx .. 'parked', key)
  end
  return true
end
