#!lua flags=allow-oom
-- extend: renew the leases of running attempts (heartbeat).
-- KEYS[1] active  zset  id -> lease deadline ms
-- KEYS[2] lease   hash  id -> token
-- ARGV triples: id, token, new deadline ms
-- Returns: ids whose lease this attempt no longer holds.
local lost = {}
for i = 1, #ARGV, 3 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[2], id) == ARGV[i + 1] then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[i + 2], id)
  else
    lost[#lost + 1] = id
  end
end
return lost
