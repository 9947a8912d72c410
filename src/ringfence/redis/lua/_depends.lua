-- Shared by depend.lua, ack.lua, dead.lua and cancel.lua (joined where they say '--@include depends'): jobs
-- enqueued with depends_on wait in the hash `waiting` (waiter id -> its dependencies not finished, comma-separated)
-- with their spec in jobs; `waiters` (dependency id -> ids waiting for it) tells a dependency's ack or death whom
-- to release. A queue without waiters pays one EXISTS per ack batch.

-- Dependencies `ids` were acked: each waiter whose last dependency this was is queued. Returns the jobs queued.
local function deps_done(waiters, waiting, pending, ids)
  if redis.call('EXISTS', waiters) == 0 then return 0 end
  local queued = 0
  for _, dep in ipairs(ids) do
    local ws = redis.call('HGET', waiters, dep)
    if ws then
      redis.call('HDEL', waiters, dep)
      for w in string.gmatch(ws, '[^,]+') do
        local left = redis.call('HGET', waiting, w)
        if left then  -- else cancelled or decided meanwhile
          local rest = {}
          for d in string.gmatch(left, '[^,]+') do if d ~= dep then rest[#rest + 1] = d end end
          if #rest == 0 then
            redis.call('HDEL', waiting, w)
            redis.call('LPUSH', pending, w)
            queued = queued + 1
          else
            redis.call('HSET', waiting, w, table.concat(rest, ','))
          end
        end
      end
    end
  end
  return queued
end

-- Dependency `first` ended without finishing (dead, cancelled): every job waiting for it goes to dead-letter
-- (reason dependency_dead, naming it), and so on down the jobs waiting for those. Returns the jobs decided.
local function deps_dead(waiters, waiting, jobs, dead, dead_jobs, stats, first, now, why)
  if redis.call('EXISTS', waiters) == 0 then return 0 end
  local todo, n = {{first, why}}, 0
  while #todo > 0 do
    local item = table.remove(todo)
    local ws = redis.call('HGET', waiters, item[1])
    if ws then
      redis.call('HDEL', waiters, item[1])
      for w in string.gmatch(ws, '[^,]+') do
        if redis.call('HDEL', waiting, w) == 1 then
          local spec = redis.call('HGET', jobs, w)
          redis.call('HDEL', jobs, w)
          local err = 'dependency ' .. item[1] .. ' ' .. item[2]
          redis.call('HSET', dead_jobs, w, '{"spec":' .. cjson.encode(spec or '{}') .. ',"attempts":0,"history":"[]"'
            .. ',"died_ms":' .. now .. ',"reason":"dependency_dead","error":' .. cjson.encode(err) .. '}')
          redis.call('ZADD', dead, now, w)
          redis.call('HINCRBY', stats, 'dead', 1)
          todo[#todo + 1] = {w, 'is dead (its own dependency ' .. item[1] .. ' ' .. item[2] .. ')'}
          n = n + 1
        end
      end
    end
  end
  return n
end
