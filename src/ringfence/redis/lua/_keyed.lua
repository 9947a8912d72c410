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

-- Put a pending entry in its key's list; the key joins the ring when its list was empty.
local function sort(pfx, entry, key, limit, seen)
  if limit and not seen[key] then
    redis.call('HSET', pfx .. 'limit', key, limit)
    seen[key] = true
  end
  if redis.call('LPUSH', pfx .. 'q:' .. key, entry) == 1 then redis.call('LPUSH', pfx .. 'ring', key) end
end

-- Lease up to want jobs taking the ring's keys in turn (lease(entry, slots) leases one, returns 1 if it did).
-- A key at its limit is parked until its earliest slot ends or a release brings it back.
local function take_turns(pfx, want, now, lease)
  local ring, parked = pfx .. 'ring', pfx .. 'parked'
  local due = redis.call('ZRANGEBYSCORE', parked, '-inf', now, 'LIMIT', 0, 100)
  for _, key in ipairs(due) do
    redis.call('ZREM', parked, key)
    redis.call('LPUSH', ring, key)
  end
  local got, steps = 0, want + 1000  -- bounds one call's work when many keys are parked at once
  while got < want and steps > 0 do
    steps = steps - 1
    local key = redis.call('RPOP', ring)
    if not key then break end
    local list, slots = pfx .. 'q:' .. key, nil
    local limit = key ~= '' and tonumber(redis.call('HGET', pfx .. 'limit', key))
    local open = true
    if limit then
      slots = pfx .. 's:' .. key
      redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
      open = redis.call('ZCARD', slots) < limit
    end
    if open then
      local entry = redis.call('RPOP', list)
      if entry then got = got + lease(entry, slots) end
      if redis.call('LLEN', list) > 0 then redis.call('LPUSH', ring, key) end
    else
      local first = redis.call('ZRANGE', slots, 0, 0, 'WITHSCORES')
      redis.call('ZADD', parked, first[2], key)
    end
  end
end
