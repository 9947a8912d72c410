-- enqueue: add jobs that are not there yet; run now (pending) or later (scheduled).
-- KEYS[1] jobs       hash  id -> spec
-- KEYS[2] pending    list
-- KEYS[3] scheduled  zset  id -> run-at ms
-- KEYS[4] idle       zset  worker -> sleeping-until ms
-- KEYS[5] stats      hash  counters
-- ARGV[1] now ms
-- ARGV[2] wake channel
-- ARGV[3..] triples: id, spec JSON, run-at ms (0 = now)
-- Returns: a list with 1 per job added and 0 per id that already existed (enqueue by id is idempotent).
local now = tonumber(ARGV[1])
local out, added, ready = {}, 0, 0
for i = 3, #ARGV, 3 do
  local id, at = ARGV[i], tonumber(ARGV[i + 2])
  if redis.call('HSETNX', KEYS[1], id, ARGV[i + 1]) == 1 then
    if at > now then
      redis.call('ZADD', KEYS[3], at, id)
    else
      redis.call('LPUSH', KEYS[2], id)
      ready = ready + 1
    end
    added = added + 1
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
if added > 0 then redis.call('HINCRBY', KEYS[5], 'enqueued', added) end
if ready > 0 and redis.call('ZCOUNT', KEYS[4], now, '+inf') > 0 then
  redis.call('PUBLISH', ARGV[2], ready)
end
return out
