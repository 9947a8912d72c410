#!lua flags=allow-oom
-- Remove an incident; its record goes only to the caller that removed it. KEYS[1] alerts; ARGV[1] incident key.
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if raw then redis.call('HDEL', KEYS[1], ARGV[1]) end
return raw
