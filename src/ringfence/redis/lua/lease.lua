#!lua flags=allow-oom
-- The alert evaluator lease, one key (a WATCH outside a transaction breaks on Redis Cluster).
-- KEYS[1] lease; ARGV[1] owner, ARGV[2] ttl ms (0: release). Returns 1 while owner holds it (acquire), 1 when
-- released by its owner (release), else 0.
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) == 0 then
  if holder then redis.call('DEL', KEYS[1]) end
  return 1
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
