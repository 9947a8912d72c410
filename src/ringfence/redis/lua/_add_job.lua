-- Shared by enqueue.lua and relay.lua (joined where they say '--@include add_job', scripts.py). KEYS[1..7]:
-- jobs, pending, scheduled, idle, stats, unique, unique_exp, as enqueue.lua lists them.

-- Forget a few expired unique holds on each call: bounded work, no sweeper needed.
local function forget_stale_holds(now)
  local stale = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', now, 'LIMIT', 0, 20)
  for _, ukey in ipairs(stale) do
    redis.call('ZREM', KEYS[7], ukey)
    redis.call('HDEL', KEYS[6], ukey)
  end
end

-- One job. Returns its answer (1: added, or the id holds this very spec: a retried call whose first reply
-- was lost; 0: the id holds another job; else the id of the queued or running job that holds the unique key)
-- and where an added job went ('ready', 'later' or nil). A job ready now without a unique key whose spec has
-- at most inline_max bytes goes into the pending list whole ('<id><spec>'), with no jobs entry: the caller
-- generated its id, so only a retry of this very call can repeat it, and fetch drops that second copy.
local function add_job(id, spec, at, ukey, hold_end, now, inline_max)
  if ukey == '' and at <= now and #spec <= inline_max then
    redis.call('LPUSH', KEYS[2], id .. spec)
    return 1, 'ready'
  end
  if ukey ~= '' then
    local holder = redis.call('HGET', KEYS[6], ukey)
    if holder and holder ~= id and redis.call('HEXISTS', KEYS[1], holder) == 1
        and tonumber(redis.call('ZSCORE', KEYS[7], ukey) or 0) > now then
      return holder, nil  -- else the holder finished or its hold ended: the key is free
    end
  end
  if redis.call('HSETNX', KEYS[1], id, spec) == 1 then
    if ukey ~= '' then
      redis.call('HSET', KEYS[6], ukey, id)
      redis.call('ZADD', KEYS[7], hold_end, ukey)
    end
    if at > now then
      redis.call('ZADD', KEYS[3], at, id)
      return 1, 'later'
    end
    redis.call('LPUSH', KEYS[2], id)
    return 1, 'ready'
  end
  if redis.call('HGET', KEYS[1], id) == spec then return 1, nil end
  return 0, nil
end

-- Count what was added and wake sleeping workers when some of it is ready.
local function added_jobs(added, ready, now, channel)
  if added > 0 then redis.call('HINCRBY', KEYS[5], 'enqueued', added) end
  if ready > 0 and redis.call('ZCOUNT', KEYS[4], now, '+inf') > 0 then
    redis.call('PUBLISH', channel, ready)
  end
end
