-- name:    queue_lib
-- layout:  1
-- Prepended to every queue_* script (and to nothing else): the state of a fair mutex, a
-- semaphore or a read-write lock, and the FIFO queue of its waiters.
-- KEYS[i..i+3] of one name, as the table s = {m, h, q, t, i}:
--   m  meta hash  <prefix>:{<name>}          ~layout, ~cap, ~seq, ~used, ~writer, ~wholds,
--                                           ~wfence, h:<owner> (read holds or permits),
--                                           f:<owner> (a permit's fencing token),
--                                           q:<owner> (what a waiter asks for: op .. units)
--   h  holders    <prefix>:{<name>}:holders  owner -> lease expiry (server ms)
--   q  queue      <prefix>:{<name>}:queue    waiter -> ticket (FIFO order)
--   t  timeouts   <prefix>:{<name>}:timeouts waiter -> eviction deadline (server ms)
-- ARGV[]:  none (the functions take their inputs as parameters)
-- returns: nothing (a library)
-- Ops: x exclusive (fair mutex), r read, w write, s permits, q a waiter's queue entry.
-- Every time is the server's clock (TIME), never a client's.

-- The server's clock in ms, from a TIME reply (taken now if not given).
local function now_ms(t)
  t = t or redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- nil if the keys hold our data in `layout` (or nothing), else the error reply.
local function check(s, layout)
  local kind = redis.call('TYPE', s.m)['ok']
  if kind ~= 'none' then
    if kind ~= 'hash' then return {-1, kind, s.i} end
    local found = redis.call('HGET', s.m, '~layout')
    if found ~= layout then return {-2, found or ''} end
  end
  for j, k in ipairs({s.h, s.q, s.t}) do
    local zk = redis.call('TYPE', k)['ok']
    if zk ~= 'none' and zk ~= 'zset' then return {-1, zk, s.i + j} end
  end
  return nil
end

local function drop_waiter(s, o)
  redis.call('ZREM', s.q, o)
  redis.call('ZREM', s.t, o)
  redis.call('HDEL', s.m, 'q:' .. o)
end

-- Removes every hold of `o` (its lease ran out).
local function drop_holder(s, o)
  local n = tonumber(redis.call('HGET', s.m, 'h:' .. o))
  if n then
    redis.call('HDEL', s.m, 'h:' .. o, 'f:' .. o)
    redis.call('HINCRBY', s.m, '~used', -n)
  end
  if redis.call('HGET', s.m, '~writer') == o then
    redis.call('HDEL', s.m, '~writer', '~wholds', '~wfence')
  end
  redis.call('ZREM', s.h, o)
end

-- Drops holders whose lease ran out and waiters past their eviction deadline; returns how
-- many went.
local function purge(s, now)
  local gone = redis.call('ZRANGE', s.h, '-inf', now, 'BYSCORE')
  for _, o in ipairs(gone) do drop_holder(s, o) end
  local late = redis.call('ZRANGE', s.t, '-inf', now, 'BYSCORE')
  for _, o in ipairs(late) do drop_waiter(s, o) end
  return #gone + #late
end

-- The waiters at the head of the queue that could all be granted now, in queue order: as many
-- as the free permits cover, every reader up to the first writer, or one exclusive waiter.
-- A waiter that does not fit stops the walk, so nobody overtakes it.
local function grantable(s)
  local out = {}
  local writer = redis.call('HEXISTS', s.m, '~writer') == 1
  local used = tonumber(redis.call('HGET', s.m, '~used')) or 0
  local cap = tonumber(redis.call('HGET', s.m, '~cap')) or 0
  local from = 0
  while true do
    local batch = redis.call('ZRANGE', s.q, from, from + 15)
    if #batch == 0 then return out end
    for _, o in ipairs(batch) do
      local want = redis.call('HGET', s.m, 'q:' .. o) or 'x1'
      local op, n = string.sub(want, 1, 1), tonumber(string.sub(want, 2)) or 1
      if op == 's' then
        if used + n > cap then return out end
        used = used + n
      elseif op == 'r' then
        if writer then return out end
        used = used + 1
      else
        if writer or used > 0 or #out > 0 then return out end
        out[1] = o
        return out
      end
      out[#out + 1] = o
    end
    from = from + 16
  end
end

-- Publishes, as one message of space-separated ids, the waiters that are grantable now, except
-- `skip` (the caller of this script). One already woken and not yet back is named again: its
-- client wakes it once either way.
local function settle(s, channel, skip)
  local ids = {}
  for _, o in ipairs(grantable(s)) do
    if o ~= skip then ids[#ids + 1] = o end
  end
  if #ids > 0 then redis.call('PUBLISH', channel, table.concat(ids, ' ')) end
end

-- Every key lives until the last lease or waiter deadline; an empty structure is deleted.
local function touch(s)
  local last = -1
  local h = redis.call('ZRANGE', s.h, -1, -1, 'WITHSCORES')
  if h[2] then last = tonumber(h[2]) end
  local t = redis.call('ZRANGE', s.t, -1, -1, 'WITHSCORES')
  if t[2] then last = math.max(last, tonumber(t[2])) end
  if last < 0 then
    redis.call('DEL', s.m, s.h, s.q, s.t)
    return
  end
  for _, k in ipairs({s.m, s.h, s.q, s.t}) do redis.call('PEXPIREAT', k, last) end
end

-- ==== end of queue_lib ====
