#!lua flags=no-writes,allow-oom
-- spec_heads: the first bytes of job specs, so readers count jobs without loading whole payloads.
-- KEYS[1] jobs  hash  id -> spec
-- ARGV[1] bytes kept of each spec
-- ARGV[2] sample size when no ids are given
-- ARGV[3] byte budget: specs longer than ARGV[1] are copied whole into Lua to cut their head, so once this
--         many bytes were copied the rest of the long ones are skipped (the first one is always read)
-- ARGV[4..] ids (none: every job when there are at most ARGV[2], else a random sample of that many)
-- Returns: {exact (1/0), head, size, ...}; a missing id gives '' and -1, a long spec past the budget '' and -2.
local keep, budget = tonumber(ARGV[1]), tonumber(ARGV[3])
local ids, exact = {}, 1
if #ARGV > 3 then
  for i = 4, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  local n = tonumber(ARGV[2])
  if redis.call('HLEN', KEYS[1]) <= n then
    ids = redis.call('HKEYS', KEYS[1])
  else
    ids = redis.call('HRANDFIELD', KEYS[1], n)
    exact = 0
  end
end
local out = {exact}
for _, id in ipairs(ids) do
  local size = redis.call('HSTRLEN', KEYS[1], id)
  if size == 0 and redis.call('HEXISTS', KEYS[1], id) == 0 then
    out[#out + 1] = ''
    out[#out + 1] = -1
  elseif size > keep and budget <= 0 then
    out[#out + 1] = ''
    out[#out + 1] = -2
  else
    if size > keep then budget = budget - size end
    -- GETRANGE has no hash counterpart: the value is copied once into Lua, never sent whole.
    out[#out + 1] = string.sub(redis.call('HGET', KEYS[1], id), 1, keep)
    out[#out + 1] = size
  end
end
return out
