#!lua
-- wf_hand_in: put a step handed over by its workflow's slot into its own queue, once per job id whatever the
-- retries: the mark (a key of this slot) records that it went in ('1') or that a cancel blocked it ('x').
-- KEYS[1] mark     string  '1' or 'x', kept until the step's completion reached its workflow (wf_back_done.lua)
-- KEYS[2] jobs     KEYS[3] pending  KEYS[4] idle  KEYS[5] stats
-- ARGV[1] now ms  ARGV[2] wake channel  ARGV[3] id  ARGV[4] spec  ARGV[5] 1: block it (cancel)  ARGV[6] mark ttl ms
-- Returns: 1 when the job went into the queue (now or before), 0 when it never will (blocked).
local mark = redis.call('GET', KEYS[1])
if not mark then
  mark = ARGV[5] == '1' and 'x' or '1'
  redis.call('SET', KEYS[1], mark, 'PX', ARGV[6])
  if mark == '1' and redis.call('HSETNX', KEYS[2], ARGV[3], ARGV[4]) == 1 then
    redis.call('LPUSH', KEYS[3], ARGV[3])
    redis.call('HINCRBY', KEYS[5], 'enqueued', 1)
    if redis.call('ZCOUNT', KEYS[4], ARGV[1], '+inf') > 0 then redis.call('PUBLISH', ARGV[2], 1) end
  end
end
return mark == '1' and 1 or 0
