#!lua flags=no-writes,allow-oom
-- pending_entry: look for one job in a slice of the pending list, newest first. The caller walks the list a
-- slice per call, so Redis is never blocked for a whole scan. Between calls entries move towards the end (LPUSH
-- in front) or leave it (RPOP); only a removal in the middle (cancel's LREM) moves them back, so the caller
-- overlaps its slices.
-- KEYS[1] pending list
-- ARGV[1] id  ARGV[2] first index (negative: from the end, as LRANGE counts; the oldest entries)
-- ARGV[3] entries per slice
-- Returns: {the entry ('<id><spec>' when inline, the id when its spec is in jobs; '' if not in the slice),
--           the next index (-1: the list ends before the slice does)}
local id, first, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if first < 0 then first = math.max(0, redis.call('LLEN', KEYS[1]) + first) end
local prefix, len = id .. '{', #id + 1
local head = string.byte(prefix, 1)
local byte, sub = string.byte, string.sub
-- The slice is read in small LRANGEs: one large reply turned into a Lua table costs several times more per
-- entry (bench/dashboard_bench.py --lookup). An entry's first byte is compared before any substring is made.
local CHUNK = 1000
local at, stop = first, first + n
while at < stop do
  local want = math.min(CHUNK, stop - at)
  local entries = redis.call('LRANGE', KEYS[1], at, at + want - 1)
  for _, entry in ipairs(entries) do
    if byte(entry, 1) == head and (entry == id or sub(entry, 1, len) == prefix) then return {entry, first} end
  end
  if #entries < want then return {'', -1} end
  at = at + want
end
return {'', stop}
