#!lua
-- store_result: keep a finished job's result record (tasks with store_result=True) and wake its waiters.
-- A list of one element: waiters block on BLMOVE key key (a rotation, so the record stays for the next reader).
-- Adds data, so it is refused at maxmemory like an enqueue (the job is then not acked and runs again).
-- KEYS[1] result  list  the record JSON (one element)
-- ARGV[1] record JSON, ARGV[2] time to live ms
-- Returns: 1
redis.call('DEL', KEYS[1])
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
