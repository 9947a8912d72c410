#!lua flags=no-writes,allow-oom
-- spec_heads: the first bytes of job specs, so readers count jobs without loading whole payloads.
-- KEYS[1] jobs     hash  id -> spec
-- KEYS[2] pending  list  ids, and inline jobs '<id><spec>' that have no jobs entry (keys.py)
-- ARGV[1] bytes kept of each spec
-- ARGV[2] sample size when no ids are given
-- ARGV[3] byte budget: specs longer than ARGV[1] are copied whole into Lua to cut their head, so once this
--         many bytes were copied the rest of the long ones are skipped (the first one is always read)
-- ARGV[4] where the sample's slices of pending start, a fraction in [0, 1) (scripts have no random source)
-- ARGV[5..] ids (none: every job when there are at most ARGV[2], else a sample of that many: random fields of
--           jobs and evenly spread slices of pending's inline entries, in proportion to their lengths)
-- Returns: {exact (1/0), head, size, ...}; a missing id gives '' and -1, a long spec past the budget '' and -2.
local keep, budget, n = tonumber(ARGV[1]), tonumber(ARGV[3]), tonumber(ARGV[2])
local out, ids = {1}, {}

local function add(spec, size)
  if size > keep and budget <= 0 then
    out[#out + 1] = ''
    out[#out + 1] = -2
  else
    if size > keep then budget = budget - size end
    out[#out + 1] = string.sub(spec, 1, keep)
    out[#out + 1] = size
  end
end

-- Inline entries of pending from index first to last; ids alone are skipped (their specs are in jobs).
local function add_inline(first, last)
  for i = first, last, 100 do
    for _, entry in ipairs(redis.call('LRANGE', KEYS[2], i, math.min(i + 99, last))) do
      local at = string.find(entry, '{', 1, true)
      if at then add(string.sub(entry, at), #entry - at + 1) end
    end
  end
end

if #ARGV > 4 then
  for i = 5, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  local hlen, plen = redis.call('HLEN', KEYS[1]), redis.call('LLEN', KEYS[2])
  if hlen + plen <= n then
    ids = redis.call('HKEYS', KEYS[1])
    add_inline(0, plen - 1)
  else
    out[1] = 0
    local from_list = math.floor(n * plen / (hlen + plen))
    if n - from_list > 0 then ids = redis.call('HRANDFIELD', KEYS[1], n - from_list) end
    local slices = math.min(10, from_list)
    for s = 0, slices - 1 do  -- spread: pending is ordered by time, and old and new versions sit at its ends
      local width = math.floor(from_list / slices)
      local span = math.floor(plen / slices)
      local first = s * span + math.floor(tonumber(ARGV[4]) * math.max(0, span - width))
      add_inline(first, first + width - 1)
    end
  end
end
for _, id in ipairs(ids) do
  local size = redis.call('HSTRLEN', KEYS[1], id)
  if size == 0 and redis.call('HEXISTS', KEYS[1], id) == 0 then
    out[#out + 1] = ''
    out[#out + 1] = -1
  else
    -- GETRANGE has no hash counterpart: a long value is copied once into Lua, never sent whole.
    if size > keep and budget <= 0 then add('', size) else add(redis.call('HGET', KEYS[1], id), size) end
  end
end
return out
