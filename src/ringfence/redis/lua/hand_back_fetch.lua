#!lua flags=allow-oom
-- hand_back_fetch: give back the jobs leased by fetches whose reply the worker never read (a timeout or a dropped
-- connection: the script may have run, or may still run late, from the server's input buffer; or the client
-- sent it again and read only the second reply). Nobody holds a job leased under such a token but those the
-- worker names, so each other goes back to the head of the queue, its attempt not counted, as
-- requeue.lua gives a job back. A fetch's jobs are found by their lease deadline (fetch.lua's ARGV[1], the score
-- in active, which only the token's holder would renew) and checked by token: a few reads per lost fetch, not a
-- scan of the lease hash. Their order among themselves is not kept. A concurrency key's slot held by one is freed
-- (as release_key_slots.lua frees it); the next fetch sorts the job into its key's list like any pending entry.
-- KEYS[1] active   zset  id -> lease deadline ms
-- KEYS[2] lease    hash  id -> token
-- KEYS[3] attempts hash  id -> attempts started
-- KEYS[4] pending  list
-- KEYS[5] jobs     hash  id -> spec
-- KEYS[6] stats    hash  counters ('handed_back')
-- KEYS[7] idle     zset  worker -> sleeping-until ms
-- KEYS[8] prefix of the queue's concurrency-key keys (lua/_keyed.lua)
-- ARGV[1] now ms  ARGV[2] wake channel  ARGV[3] n: how many fetches
-- ARGV[4..3+2n] pairs: lease deadline ms, token of a fetch whose reply was lost (its ARGV[1] and ARGV[3])
-- ARGV[4+2n..] ids the worker holds, kept: a fetch the client sent again (the resend answered) leased these
-- under the same token and deadline
-- Returns: the ids handed back.
--@include keyed
local out, slots, held = {}, {}, {}
local last = 3 + 2 * tonumber(ARGV[3])
for i = last + 1, #ARGV do held[ARGV[i]] = true end
for i = 4, last, 2 do
  local token = ARGV[i + 1]
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[i], ARGV[i])) do
    if not held[id] and redis.call('HGET', KEYS[2], id) == token then
      redis.call('ZREM', KEYS[1], id)
      redis.call('HDEL', KEYS[2], id)
      if redis.call('HINCRBY', KEYS[3], id, -1) <= 0 then redis.call('HDEL', KEYS[3], id) end
      redis.call('RPUSH', KEYS[4], id)
      local spec = redis.call('HGET', KEYS[5], id)
      local key = spec and entry_key(spec)
      if key then
        slots[#slots + 1] = key
        slots[#slots + 1] = id .. ':' .. token  -- the slot's holder: the attempt (fetch.lua)
      end
      out[#out + 1] = id
    end
  end
end
if #slots > 0 then free_slots(KEYS[8], slots, 1) end
if #out > 0 then
  redis.call('HINCRBY', KEYS[6], 'handed_back', #out)
  if redis.call('ZCOUNT', KEYS[7], ARGV[1], '+inf') > 0 then redis.call('PUBLISH', ARGV[2], #out) end
end
return out
