#!lua flags=allow-oom
-- ack: jobs finished; forget them.
-- KEYS[1] active    zset
-- KEYS[2] lease     hash  id -> token
-- KEYS[3] jobs      hash
-- KEYS[4] attempts  hash
-- KEYS[5] history   hash
-- KEYS[6] stats     hash
-- ARGV pairs: id, token
-- Returns: ids whose lease this attempt no longer held (not acked: another attempt owns them).
local lost, done = {}, 0
for i = 1, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[2], id) == ARGV[i + 1] then
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
    done = done + 1
  else
    lost[#lost + 1] = id
  end
end
if done > 0 then redis.call('HINCRBY', KEYS[6], 'processed', done) end
return lost
