-- Shared by wf_start.lua, advance.lua, dead.lua and wf_apply.lua (joined where they say '--@include workflow',
-- scripts.py). A workflow is one hash in its home queue's slot (redis/workflows.py lists its fields). A step of
-- that queue is queued, and its ack advances the workflow, in one script; a step of another queue ('q<i>': its
-- queue) is handed over: its spec is kept in the hash ('o<i>') and named in the home queue's hand-over zset
-- (`out`), for the caller (or the sweep) to put it in its queue (wf_hand_in.lua) and close the entry
-- (wf_handed.lua); the scripts reply with the steps handed over.

local handed = {}  -- per call: index, queue, job id, spec of each step handed over

-- The spec of step i, stored in parts: head ('{"t":..,"w":..' without its closing brace) and the payload's fields
-- (its JSON object without braces); a step that declares `previous` gets its inputs' results there, in order.
local function step_spec(wf, i, now)
  local f = redis.call('HMGET', wf, 'h' .. i, 'a' .. i, 'p' .. i, 'd' .. i)
  local args = f[2]
  if f[3] == '1' or f[3] == 'l' then  -- '1': the one input's result; 'l': a list of the inputs' results
    local inputs = {}
    for d in string.gmatch(f[4] or '', '[^,]+') do inputs[#inputs + 1] = redis.call('HGET', wf, 'r' .. d) or 'null' end
    local prev = f[3] == '1' and (inputs[1] or 'null') or ('[' .. table.concat(inputs, ',') .. ']')
    args = '"previous":' .. prev .. (args ~= '' and (',' .. args) or '')
  end
  return f[1] .. ',"e":' .. now .. ',"a":{' .. args .. '}}'
end

-- Queue step i now (once: its state leaves 'waiting'); a step of another queue is handed over instead (not
-- counted here: wf_hand_in.lua counts it in its queue).
local function queue_step(wf, i, now, jobs, pending, out)
  if redis.call('HGET', wf, 's' .. i) ~= 'waiting' then return 0 end
  local f = redis.call('HMGET', wf, 'j' .. i, 'q' .. i)  -- one call: a workflow of one queue pays nothing more
  local id, q = f[1], f[2]
  if q then
    local spec = step_spec(wf, i, now)
    redis.call('HSET', wf, 's' .. i, 'handing', 'o' .. i, spec)
    redis.call('HDEL', wf, 'h' .. i, 'a' .. i)
    redis.call('ZADD', out, now, redis.call('HGET', wf, 'id') .. ':' .. i)
    for _, v in ipairs({tostring(i), q, id, spec}) do handed[#handed + 1] = v end
    return 0
  end
  redis.call('HSETNX', jobs, id, step_spec(wf, i, now))
  redis.call('LPUSH', pending, id)
  redis.call('HSET', wf, 's' .. i, 'queued')
  redis.call('HDEL', wf, 'h' .. i, 'a' .. i)
  return 1
end

-- Step i has an outcome its dependents may start from: each dependent whose last input this was is queued,
-- unless the workflow was cancelled. Once per step ('x' marks it). Returns the steps queued.
local function release(wf, i, now, jobs, pending, out)
  if redis.call('HSETNX', wf, 'x' .. i, '1') == 0 then return 0 end
  local queued = 0
  local cancelled = redis.call('HGET', wf, 'state') == 'cancelled'
  for j in string.gmatch(redis.call('HGET', wf, 'c' .. i) or '', '[^,]+') do
    if redis.call('HINCRBY', wf, 'w' .. j, -1) == 0 and not cancelled then
      queued = queued + queue_step(wf, j, now, jobs, pending, out)
    end
  end
  return queued
end

-- One step fewer to wait for; the last one finishes the workflow, which then expires after its ttl.
local function settled(wf)
  if redis.call('HINCRBY', wf, 'left', -1) <= 0 then
    local state = redis.call('HGET', wf, 'state')
    if state == 'running' then redis.call('HSET', wf, 'state', 'done') end
    redis.call('PEXPIRE', wf, redis.call('HGET', wf, 'ttl'))
  end
end

-- Step i's job finished (ack): its result kept for its dependents, its dependents released. A step that was
-- dead (replayed since) no longer fails the workflow.
local function step_done(wf, i, result, now, jobs, pending, out)
  local was = redis.call('HGET', wf, 's' .. i)
  if was == 'done' or not was then return 0 end
  redis.call('HSET', wf, 's' .. i, 'done', 'r' .. i, result)
  redis.call('HDEL', wf, 'e' .. i)
  if was == 'dead' then
    local dead = redis.call('HINCRBY', wf, 'dead', -1)
    if redis.call('HGET', wf, 'x' .. i) then return 0 end  -- released when it died: counted then
    if dead <= 0 and redis.call('HGET', wf, 'state') == 'failed' then redis.call('HSET', wf, 'state', 'running') end
  end
  local queued = release(wf, i, now, jobs, pending, out)
  settled(wf)
  return queued
end

-- Step i's job went to dead-letter. Its dependents that take failures ('k<i>' = 1, a chord's 'continue'
-- policy) start with the failure as its result; else the workflow is failed, naming the step.
local function step_dead(wf, i, failure, now, jobs, pending, out)
  local was = redis.call('HGET', wf, 's' .. i)
  if was == 'done' or was == 'dead' or not was then return 0 end
  redis.call('HSET', wf, 's' .. i, 'dead', 'e' .. i, failure)
  redis.call('HINCRBY', wf, 'dead', 1)
  if redis.call('HGET', wf, 'k' .. i) == '1' then
    redis.call('HSET', wf, 'r' .. i, failure)
    local queued = release(wf, i, now, jobs, pending, out)
    settled(wf)
    return queued
  end
  if redis.call('HGET', wf, 'state') == 'running' then redis.call('HSET', wf, 'state', 'failed') end
  return 0
end

-- Wake an idle worker of the queue when steps were queued.
local function woke(queued, idle, now, channel, stats)
  if queued > 0 then
    redis.call('HINCRBY', stats, 'enqueued', queued)
    if redis.call('ZCOUNT', idle, now, '+inf') > 0 then redis.call('PUBLISH', channel, queued) end
  end
end

-- The reply of a script that may have handed steps over: n alone, or n then the steps handed over.
local function with_handed(n)
  if #handed == 0 then return n end
  local reply = {n}
  for _, v in ipairs(handed) do reply[#reply + 1] = v end
  return reply
end
