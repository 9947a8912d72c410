#!lua flags=allow-oom
-- release_key_slots: free slots of concurrency keys (lua/_keyed.lua) of one queue; a key parked at its limit goes
-- back to the ring, so its next job is fetched in its turn, and the queue's idle workers are woken for it.
-- KEYS[1] parked  zset  key -> ms to look again (KEYS[4] .. 'parked')
-- KEYS[2] ring    list  keys whose jobs may run, taken in turn (KEYS[4] .. 'ring')
-- KEYS[3] idle    zset  worker -> sleeping-until ms
-- KEYS[4] prefix of the key's slots: KEYS[4] .. 's:' .. key is its zset holder -> slot lease end ms
-- ARGV[1] now ms  ARGV[2] wake channel  ARGV[3..] pairs: key, holder ('<job id>:<lease token>': one attempt)
-- Returns: how many keys went back to the ring.
--@include keyed
local back = free_slots(KEYS[4], ARGV, 3)
if back > 0 and redis.call('ZCOUNT', KEYS[3], ARGV[1], '+inf') > 0 then redis.call('PUBLISH', ARGV[2], back) end
return back
