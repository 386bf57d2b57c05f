-- name:    queue_acquire
-- layout:  1 (tag "fair:1", "semaphore:1" or "rwlock:1" in field "~layout" of the meta hash)
-- KEYS[1]: meta hash  <prefix>:{<name>}           (see queue_lib for KEYS[1..3])
-- KEYS[2]: holders    <prefix>:{<name>}:holders
-- KEYS[3]: queue      <prefix>:{<name>}:queue
-- KEYS[4]: fence key  <prefix>:{<name>}:fence     last fencing token issued while idle
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
--          {0, wait, queued}  not now: queued is 1 if the owner waits in the queue (0 for a try,
--                             ARGV[7] = 0), and nothing changes without a wake-up message for
--                             `wait` ms (until the earliest lease or waiter deadline, or a
--                             little before; -1: never)
--          {-1, type, i}      KEYS[i] holds foreign data of that Redis type
--          {-2, layout}       the meta hash carries another layout tag
--          {-3, capacity}     the semaphore is in use with another capacity
--          {-4}               the owner holds a read lock and asked to write (upgrade refused)
local layout, op, owner = ARGV[1], ARGV[2], ARGV[3]
local units, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local lease, patience, channel, claim = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[9], ARGV[10]

local s, err = open(KEYS, layout, {'h:' .. owner, 'q:' .. owner})
if not s then return err end
s.f, s.ttl, s.cap = KEYS[4], ARGV[8], cap
if op == 's' and s.exists and num(s, '~cap') ~= cap then return {-3, num(s, '~cap')} end

local clock = redis.call('TIME')
local now = now_ms(clock)
-- Whatever ran out goes to the head of the queue first. A waiter that asks again (it missed its
-- message, or its timer ran out) hands over too, so nobody waits behind a head that could go.
if purge(s, now) > 0 or get(s, 'q:' .. owner) then handoff(s, channel, now, clock) end

local writer = get(s, '~writer')
local reads = tonumber(get(s, 'h:' .. owner))
local queued = get(s, 'q:' .. owner) ~= false

-- A new owner that already holds: the answer to an earlier attempt was lost, or a hand-over
-- came first. Return that hold.
if claim == 'new' then
  if (op == 'x' or op == 'w') and writer == owner then
    return finish(s, {1, get(s, '~wfence'), num(s, '~wholds')})
  end
  if (op == 'r' or op == 's') and reads then
    return finish(s, {1, get(s, 'f:' .. owner) or 0, reads})
  end
end

-- Re-entry never waits: the owner already holds the lock.
if (op == 'x' or op == 'w') and writer == owner then
  local holds = num(s, '~wholds') + 1
  put(s, '~wholds', holds)
  if now + lease > num(s, '~wexp') then
    put(s, '~wexp', now + lease)
    deadline(s, now + lease)
  end
  return finish(s, {1, get(s, '~wfence'), holds})
end
if op == 'r' and (reads or writer == owner) then
  put(s, 'h:' .. owner, (reads or 0) + 1)
  share(s, owner, 1, now + lease)
  return finish(s, {1, 0, (reads or 0) + 1})
end
if op == 'w' and reads then return finish(s, {-4}) end
if claim == 'again' then return finish(s, {0, -1, 0}) end

-- A newcomer goes at once when nobody waits and it fits. At rest the head of a queue is never
-- one that could go (releases and purges hand over at once), so a queue means waiting.
if not queued and num(s, '~waiting') == 0 then
  local used = num(s, '~used')
  local fits
  if op == 's' then fits = used + units <= cap
  elseif op == 'r' then fits = not writer
  else fits = (not writer) and used == 0 end
  if fits then
    local token = 0
    if op ~= 'r' then
      token = mint(s, clock)
      if token == nil then return finish(s, {-1, redis.call('TYPE', s.f)['ok'], 4}) end
    end
    return finish(s, {1, take(s, owner, op, units, now + lease, token), units})
  end
end

if patience > 0 then
  local d = now + patience
  put(s, 'q:' .. owner, op .. units .. '/' .. lease .. '/' .. d)
  if not queued then
    local seq = num(s, '~seq') + 1
    put(s, '~seq', seq)
    if num(s, '~waiting') == 0 then s.fresh[s.q] = true end
    put(s, '~waiting', num(s, '~waiting') + 1)
    redis.call('ZADD', s.q, seq, owner)
  end
  deadline(s, d)
end
local wait = -1
if s.next then wait = s.next - now end
return finish(s, {0, wait, patience > 0 and 1 or 0})
