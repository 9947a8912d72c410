#!lua flags=allow-oom
-- claim_environment: record the namespace's environment on first use (one small field, so it runs at maxmemory:
-- a worker can start on a full Redis).
-- KEYS[1] meta  hash  environment, ...
-- ARGV[1] the environment of this worker
-- Returns: the environment recorded (this one when the namespace was new).
redis.call('HSETNX', KEYS[1], 'environment', ARGV[1])
return redis.call('HGET', KEYS[1], 'environment')
