-- name:    queue_acquire
-- layout:  1 (tag "fair:1", "semaphore:1" or "rwlock:1" in field "~layout" of the meta hash)
-- KEYS[1]: meta hash  <prefix>:{<name>}           (see queue_lib for KEYS[1..4])
-- KEYS[2]: holders    <prefix>:{<name>}:holders
-- KEYS[3]: queue      <prefix>:{<name>}:queue
-- KEYS[4]: timeouts   <prefix>:{<name>}:timeouts
-- KEYS[5]: fence key  <prefix>:{<name>}:fence     last fencing token issued for this name
-- ARGV[1]: layout tag
-- ARGV[2]: op: x (fair mutex), r (read), w (write), s (permits)
-- ARGV[3]: owner token (also the waiter's id in the queue)
-- ARGV[4]: units: permits wanted for s, else 1
-- ARGV[5]: capacity for s (must match the stored one), else 0
-- ARGV[6]: lease in milliseconds
-- ARGV[7]: waiter timeout in milliseconds; 0 = do not queue (try once)
-- ARGV[8]: lifetime of the fence key in milliseconds
-- ARGV[9]: wake-up channel <prefix>:{<name>}:wake
-- ARGV[10]: claim: new (a token made for this call: if it already holds, an earlier attempt's
--           answer was lost, and that hold is returned as is), as (join the owner's holds, or
--           acquire) or again (re-entry only: add a hold only if the owner holds)
-- returns: {1, fence, holds}  acquired; fence is 0 for read holds; holds is the owner's hold
--                             count of this op after the call (the permits for s)
--          {0, wait, pos}     not now: the owner is queued at place pos (0 = head; -1 if
--                             ARGV[7] is 0), and nothing changes without a wake-up message for
--                             `wait` ms (a holder's lease or another waiter's deadline; -1: never)
--          {-1, type, i}      KEYS[i] holds foreign data of that Redis type
--          {-2, layout}       the meta hash carries another layout tag
--          {-3, capacity}     the semaphore is in use with another capacity
--          {-4}               the owner holds a read lock and asked to write (upgrade refused)
local s = {m = KEYS[1], h = KEYS[2], q = KEYS[3], t = KEYS[4], i = 1, f = KEYS[5], ttl = ARGV[8]}
local layout, op, owner = ARGV[1], ARGV[2], ARGV[3]
local units, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local lease, patience, claim = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[10]

local err, exists = check(s, layout)
if err then return err end

local clock = redis.call('TIME')
local now = now_ms(clock)
local purged = 0
if not exists then
  redis.call('HSET', s.m, '~layout', layout, '~used', 0, '~cap', cap)
else
  if op == 's' then
    local stored = tonumber(redis.call('HGET', s.m, '~cap'))
    if stored ~= cap then return {-3, stored or 0} end
  end
  purged = purge(s, now)
end

local mine = redis.call('HMGET', s.m, '~writer', 'h:' .. owner)
local writer, reads = mine[1] or nil, tonumber(mine[2])
local queued = redis.call('ZSCORE', s.q, owner)

-- Every answer from here on hands over and touches. Only a purge (a lease or a waiter's time
-- ran out) can make other waiters grantable in this script.
local function done(reply)
  if purged > 0 then handoff(s, ARGV[9], now, clock) end
  touch(s)
  return reply
end

local function reentered(fence, holds)
  redis.call('ZADD', s.h, 'GT', now + lease, owner)
  return done({1, fence, holds})
end

-- A new owner that already holds: the answer to an earlier attempt was lost. Return that hold.
if claim == 'new' then
  if (op == 'x' or op == 'w') and writer == owner then
    return done({1, redis.call('HGET', s.m, '~wfence'), tonumber(redis.call('HGET', s.m, '~wholds'))})
  end
  if (op == 'r' or op == 's') and reads then
    return done({1, redis.call('HGET', s.m, 'f:' .. owner) or 0, reads})
  end
end
-- Re-entry never waits: the owner already holds the lock.
if (op == 'x' or op == 'w') and writer == owner then
  return reentered(redis.call('HGET', s.m, '~wfence'), redis.call('HINCRBY', s.m, '~wholds', 1))
end
if op == 'r' and (reads or writer == owner) then
  redis.call('HINCRBY', s.m, '~used', 1)
  return reentered(0, redis.call('HINCRBY', s.m, 'h:' .. owner, 1))
end
if op == 'w' and reads then return done({-4}) end
if claim == 'again' then return done({0, -1, -1}) end

-- A caller may take it when it is in the grantable head of the queue. A newcomer facing an
-- empty queue only needs the lock or permits to be free; facing a queue, it takes its place at
-- the tail first: it may still fit (spare permits, readers), and then it goes at once.
local may, added = false, false
if not queued and redis.call('ZCARD', s.q) == 0 then
  local used = tonumber(redis.call('HGET', s.m, '~used')) or 0
  if op == 's' then may = used + units <= cap
  elseif op == 'r' then may = not writer
  else may = (not writer) and used == 0 end
else
  if not queued then
    redis.call('ZADD', s.q, redis.call('HINCRBY', s.m, '~seq', 1), owner)
    redis.call('HSET', s.m, 'q:' .. owner, op .. units .. '/' .. lease)
    queued, added = true, true
  end
  may = may_go(s, owner)
end

if may then
  local token = 0
  if op ~= 'r' then
    token = mint(s, clock)
    if token == nil then return {-1, redis.call('TYPE', s.f)['ok'], 5} end
  end
  take(s, owner, op, units, lease, now, token)
  if queued then drop_waiter(s, owner) end
  return done({1, token, units})
end

local pos = -1
if patience > 0 then
  if not queued then
    redis.call('ZADD', s.q, redis.call('HINCRBY', s.m, '~seq', 1), owner)
    redis.call('HSET', s.m, 'q:' .. owner, op .. units .. '/' .. lease)
  end
  redis.call('ZADD', s.t, now + patience, owner)
  pos = redis.call('ZRANK', s.q, owner)
elseif added then
  -- A try that does not queue leaves no place behind.
  drop_waiter(s, owner)
end

local wait = -1
local first = redis.call('ZRANGE', s.h, 0, 0, 'WITHSCORES')
if first[2] then wait = tonumber(first[2]) - now end
local ahead = redis.call('ZRANGE', s.t, 0, 1, 'WITHSCORES')
for j = 1, #ahead, 2 do
  if ahead[j] ~= owner then
    local d = tonumber(ahead[j + 1]) - now
    if wait < 0 or d < wait then wait = d end
    break
  end
end
return done({0, wait, pos})
