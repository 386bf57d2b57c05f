-- name:    queue_lib
-- layout:  1
-- Prepended to every queue_* script (and to nothing else): the state of a fair mutex, a
-- semaphore or a read-write lock, and the FIFO queue of its waiters.
-- KEYS[i..i+3] of one name, as the table s = {m, h, q, t, i} (f and ttl: the fence key and
-- its lifetime, for scripts that grant):
--   m  meta hash  <prefix>:{<name>}          ~layout, ~cap, ~seq, ~used, ~writer, ~wholds,
--                                           ~wfence, h:<owner> (read holds or permits),
--                                           f:<owner> (a permit's fencing token),
--                                           q:<owner> (what a waiter asks for:
--                                           op .. units .. '/' .. lease ms)
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

-- Whether the keys hold our data in `layout`: returns (nil, exists) or the error reply. The
-- sorted sets are checked when the meta hash is missing; while it exists, our scripts made
-- them (foreign data there makes the first read fail, before anything is written).
local function check(s, layout)
  local kind = redis.call('TYPE', s.m)['ok']
  if kind ~= 'none' then
    if kind ~= 'hash' then return {-1, kind, s.i} end
    local found = redis.call('HGET', s.m, '~layout')
    if found ~= layout then return {-2, found or ''} end
    return nil, true
  end
  for j, k in ipairs({s.h, s.q, s.t}) do
    local zk = redis.call('TYPE', k)['ok']
    if zk ~= 'none' and zk ~= 'zset' then return {-1, zk, s.i + j} end
  end
  return nil, false
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

-- What waiter `o` asks for: op, units and lease ms.
local function want(s, o)
  local w = redis.call('HGET', s.m, 'q:' .. o) or 'x1/0'
  local op, n, lease = string.match(w, '^(%a)(%d+)/(%d+)$')
  return op or 'x', tonumber(n) or 1, tonumber(lease) or 0
end

-- The waiters at the head of the queue that could all be granted now, in queue order: as many
-- as the free permits cover, every reader up to the first writer, or one exclusive waiter.
-- A waiter that does not fit stops the walk, so nobody overtakes it. Each entry is
-- {id, op, units, lease}.
local function grantable(s)
  local out = {}
  local meta = redis.call('HMGET', s.m, '~writer', '~used', '~cap')
  local writer = meta[1] ~= false
  local used = tonumber(meta[2]) or 0
  local cap = tonumber(meta[3]) or 0
  local from = 0
  while true do
    local batch = redis.call('ZRANGE', s.q, from, from + 15)
    if #batch == 0 then return out end
    for _, o in ipairs(batch) do
      local op, n, lease = want(s, o)
      if op == 's' then
        if used + n > cap then return out end
        used = used + n
      elseif op == 'r' then
        if writer then return out end
        used = used + 1
      else
        if writer or used > 0 or #out > 0 then return out end
        out[1] = {o, op, n, lease}
        return out
      end
      out[#out + 1] = {o, op, n, lease}
    end
    from = from + 16
  end
end

-- True if waiter `o` is in the grantable head of the queue.
local function may_go(s, o)
  for _, g in ipairs(grantable(s)) do
    if g[1] == o then return true end
  end
  return false
end

-- A new fencing token: strictly above the last one issued for the name, and never below the
-- server clock in microseconds (`clock` is a TIME reply). nil if the fence key is foreign.
local function mint(s, clock)
  local kind = redis.call('TYPE', s.f)['ok']
  if kind ~= 'none' and kind ~= 'string' then return nil end
  local last = tonumber(redis.call('GET', s.f) or '0')
  if last == nil then return nil end
  local token = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  token = string.format('%.0f', math.max(last + 1, token))
  redis.call('SET', s.f, token, 'PX', s.ttl)
  return token
end

-- Gives `o` a fresh hold of `op` (units for s) until now + lease; returns its fencing token
-- (0 for a read hold). The caller has checked that it fits.
local function take(s, o, op, units, lease, now, token)
  if op == 'r' then
    redis.call('HINCRBY', s.m, '~used', 1)
    redis.call('HINCRBY', s.m, 'h:' .. o, 1)
    token = 0
  elseif op == 's' then
    redis.call('HSET', s.m, 'h:' .. o, units, 'f:' .. o, token)
    redis.call('HINCRBY', s.m, '~used', units)
  else
    redis.call('HSET', s.m, '~writer', o, '~wholds', 1, '~wfence', token)
  end
  redis.call('ZADD', s.h, 'GT', now + lease, o)
  return token
end

-- Hands the lock over: every waiter that is grantable now gets its hold here, leaves the
-- queue, and is told in one message of space-separated `id:fence:ms` triples on `channel`. The
-- hold's first term (ms) is its lease, cut to what is left of the waiter's place: a waiter
-- that died in the queue holds the lock no longer than it would have held up the queue. A
-- waiter that misses the message finds the hold when it next tries (claim `new`).
local function handoff(s, channel, now, clock)
  local told = {}
  for _, g in ipairs(grantable(s)) do
    local o, op, n, lease = g[1], g[2], g[3], g[4]
    local deadline = tonumber(redis.call('ZSCORE', s.t, o))
    if deadline then lease = math.max(math.min(lease, deadline - now), 1) end
    local token = 0
    if op ~= 'r' then token = mint(s, clock) or 0 end
    take(s, o, op, n, lease, now, token)
    drop_waiter(s, o)
    told[#told + 1] = o .. ':' .. token .. ':' .. lease
  end
  if #told > 0 then redis.call('PUBLISH', channel, table.concat(told, ' ')) end
end

-- Every key lives until the last lease or waiter deadline, rounded up to the next whole second
-- (so most calls find the expiry already right and leave it); an empty structure is deleted.
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
  last = (math.floor(last / 1000) + 1) * 1000
  if redis.call('PEXPIRETIME', s.m) == last then return end
  for _, k in ipairs({s.m, s.h, s.q, s.t}) do redis.call('PEXPIREAT', k, last) end
end

-- ==== end of queue_lib ====
