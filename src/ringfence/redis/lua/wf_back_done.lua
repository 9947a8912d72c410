#!lua flags=allow-oom
-- wf_back_done: a step's completion reached its workflow (wf_apply.lua): forget it, unless a later one (the step
-- replayed) replaced it meanwhile; its hand-in mark is kept a little longer for a sweep that read the hand-over
-- before the completion closed it (wf_hand_in.lua), then expires.
-- KEYS[1] back zset  KEYS[2] back_data hash  KEYS[3] mark
-- ARGV[1] id  ARGV[2] the completion entry applied  ARGV[3] the mark's remaining life ms
-- Returns: 1 when forgotten.
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
if redis.call('PTTL', KEYS[3]) > tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[3], ARGV[3]) end
return 1
