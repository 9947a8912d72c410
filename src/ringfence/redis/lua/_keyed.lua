-- Joined into fetch.lua (scripts.py '--@include keyed'): jobs with a concurrency key (tasks.py concurrency_key).
-- At most its limit of a key's jobs run at once, and fetch takes the keys in turn, so a key with a deep backlog
-- gets one job per turn and no more. Every key here starts with the prefix pfx (fetch.lua's KEYS[10]), in the
-- queue's slot:
--   pfx..'ring'      list  keys with jobs waiting that may run: RPOP the next, LPUSH it back behind the others
--   pfx..'parked'    zset  key -> ms to look again: keys at their limit with jobs waiting; free_slots (below)
--                          moves a key back to the ring, and the ms (its earliest slot's end) frees a dead worker's
--   pfx..'limit'     hash  key -> its limit (from the latest job's spec)
--   pfx..'q:'..key   list  the key's jobs waiting: pending entries as in pending (LPUSH, RPOP)
--   pfx..'s:'..key   zset  slots: holder -> slot lease end ms (extend_slots.lua renews them). The holder is the
--                          attempt, '<job id>:<lease token>': a run whose lease lapsed frees or renews its own
--                          slot, never the one of the attempt that replaced it
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

-- Entries grouped by key for sort(): g.sorted[key] holds the key's entries in queue order, g.order the keys as
-- first seen, g.limits their limits.
local function new_groups() return {sorted = {}, order = {}, limits = {}} end
local function group(g, key, limit, entry)
  local entries = g.sorted[key]
  if not entries then
    entries = {}
    g.sorted[key] = entries
    g.order[#g.order + 1] = key
  end
  entries[#entries + 1] = entry
  g.limits[key] = limit or g.limits[key]
end

-- Sort grouped entries (new_groups, group) into their keys' lists; a key joins the ring when its list was empty.
-- The queue's stats count them in 'keyed_waiting' (queries.py adds them to pending).
local function sort(pfx, stats, g)
  local order, sorted, limits = g.order, g.sorted, g.limits
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

-- Run cmd on key with items as its trailing arguments, 1000 a call (unpack is bounded by Lua's C stack).
local function each_1000(cmd, key, items)
  for i = 1, #items, 1000 do redis.call(cmd, key, unpack(items, i, math.min(i + 999, #items))) end
end

-- Free slots: args[first..] pairs key, holder. One ZREM per key, not per slot; a key parked at its limit goes
-- back to the ring. Returns how many keys went back.
local function free_slots(pfx, args, first)
  local holders, order = {}, {}
  for i = first, #args, 2 do
    local h = holders[args[i]]
    if not h then
      h = {}
      holders[args[i]] = h
      order[#order + 1] = args[i]
    end
    h[#h + 1] = args[i + 1]
  end
  local back = {}
  for _, key in ipairs(order) do
    each_1000('ZREM', pfx .. 's:' .. key, holders[key])
    if redis.call('ZREM', pfx .. 'parked', key) == 1 then back[#back + 1] = key end
  end
  each_1000('LPUSH', pfx .. 'ring', back)
  return #back
end

-- Lease up to want jobs taking the ring's keys in turn (lease(entry) leases one and returns its id, or nil); a
-- leased job's slot, held by '<id>:<token>' (token: the fetch's lease token), lasts until slot_until. Keys come off the ring as many at once as jobs are wanted, one job
-- each; only once the ring is empty (every key whose jobs may run is in hand) do they get more turns in the same
-- call. A key's jobs come off its list in one RPOP, its slots go in one ZADD: a lone key with a backlog fills a
-- call in a few commands, not a few per job. A key at its limit is parked until its earliest slot ends or a
-- release brings it back. Returns true when it put keys on the ring (false: the ring may or may not hold any).
local function take_turns(pfx, stats, want, now, slot_until, token, lease)
  local ring, parked = pfx .. 'ring', pfx .. 'parked'
  local due = redis.call('ZRANGEBYSCORE', parked, '-inf', now, 'LIMIT', '0', '100')
  if #due > 0 then
    redis.call('ZREM', parked, unpack(due))
    redis.call('LPUSH', ring, unpack(due))
  end
  if want <= 0 then return #due > 0 end
  local function park(k)
    local first = redis.call('ZRANGE', k.slots, 0, 0, 'WITHSCORES')
    redis.call('ZADD', parked, first[2], k.key)
  end
  -- the keys in hand, in turn order; steps bound one call's work when many keys are at their limit at once
  local hand, seen, ended, steps = {}, {}, false, want + 1000
  while #hand < want and steps > 0 do
    local n = math.min(want - #hand, steps)
    local keys = redis.call('RPOP', ring, n)
    if not keys then
      ended = true
      break
    end
    steps = steps - #keys
    for _, key in ipairs(keys) do
      local k = {key = key, list = pfx .. 'q:' .. key, held = 0, n = 0, slotted = {}}
      k.waiting = seen[key] and 0 or redis.call('LLEN', k.list)  -- a key twice in the ring gets one turn
      seen[key] = true
      k.limit = key ~= '' and tonumber(redis.call('HGET', pfx .. 'limit', key))
      if k.limit then
        k.slots = pfx .. 's:' .. key
        redis.call('ZREMRANGEBYSCORE', k.slots, '-inf', now)
        k.held = redis.call('ZCARD', k.slots)
      end
      if k.waiting > 0 then  -- (an empty key is in neither ring nor parked: dropped)
        if k.limit and k.held >= k.limit then park(k) else hand[#hand + 1] = k end
      end
    end
    if #keys < n then
      ended = true
      break
    end
  end
  -- the turns: one per key in hand; more only once every key is in hand
  local got = 0
  repeat
    local more = false
    for _, k in ipairs(hand) do
      if got < want and k.n < k.waiting and not (k.limit and k.held + k.n >= k.limit) then
        k.n, got, more = k.n + 1, got + 1, true
      end
    end
  until got >= want or not more or not ended
  local taken, turns = 0, 0
  for _, k in ipairs(hand) do
    if k.n > 0 then
      k.entries = redis.call('RPOP', k.list, k.n)
      taken, turns = taken + k.n, math.max(turns, k.n)
    end
  end
  for turn = 1, turns do  -- leased in turn order: every key's first job, then the second ones
    for _, k in ipairs(hand) do
      local id = turn <= k.n and lease(k.entries[turn])
      if id and k.slots then
        k.slotted[#k.slotted + 1] = slot_until
        k.slotted[#k.slotted + 1] = id .. ':' .. token
      end
    end
  end
  local back = {}
  for _, k in ipairs(hand) do
    if k.slots then each_1000('ZADD', k.slots, k.slotted) end
    if k.waiting > k.n then
      if k.limit and k.held + #k.slotted / 2 >= k.limit then park(k) else back[#back + 1] = k.key end
    end
  end
  each_1000('LPUSH', ring, back)
  if taken > 0 then redis.call('HINCRBY', stats, 'keyed_waiting', -taken) end
  return #back > 0
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
