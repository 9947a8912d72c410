#!lua flags=allow-oom
-- ack_lost: acks a worker sent just before Redis failed over, checked on the master that answers now. A job whose
-- ack this master never got is back (queued again, or leased to another attempt) and runs again: its history
-- says why, its finished attempt counts (when not fetched again yet) and stats count it (ack_lost).
-- KEYS[1] lease     hash  id -> token
-- KEYS[2] jobs      hash
-- KEYS[3] pending   list
-- KEYS[4] attempts  hash
-- KEYS[5] history   hash  id -> JSON list
-- KEYS[6] stats     hash
-- ARGV[1] now ms  ARGV[2] worker, then per job: id, token, pending entry of an inline job (id..spec), finished ms
-- Returns: {ids recorded as running again, ids still leased to their token (their ack is to be sent again)}
local now = tonumber(ARGV[1])
local recorded, ours = {}, {}
for i = 3, #ARGV, 4 do
  local id, token = ARGV[i], ARGV[i + 1]
  local held = redis.call('HGET', KEYS[1], id)
  local attempt = tonumber(redis.call('HGET', KEYS[4], id) or '0')
  local back = held ~= false
  if held == token then
    ours[#ours + 1] = id
    back = false
  elseif not back and (redis.call('HEXISTS', KEYS[2], id) == 1
      or redis.call('LPOS', KEYS[3], ARGV[i + 2], 'RANK', -1, 'MAXLEN', 1000)) then
    back = true
    attempt = attempt + 1  -- the attempt that finished; its fetch was lost too: the next one counts after it
    redis.call('HSET', KEYS[4], id, attempt)
  end
  if back then
    local entry = '{"attempt":' .. attempt .. ',"ack_lost":true,"error":"finished at ' .. ARGV[i + 3] .. ' ms on '
      .. ARGV[2] .. ', but Redis lost its ack (a failover): it runs again","at":' .. now .. '}'
    local hist = redis.call('HGET', KEYS[5], id)
    redis.call('HSET', KEYS[5], id, hist and (string.sub(hist, 1, -2) .. ',' .. entry .. ']') or ('[' .. entry .. ']'))
    recorded[#recorded + 1] = id
  end
end
if #recorded > 0 then redis.call('HINCRBY', KEYS[6], 'ack_lost', #recorded) end
return {recorded, ours}
