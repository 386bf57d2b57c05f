-- name:    queue_acquire
-- layout:  1 (tag "fair:1", "semaphore:1" or "rwlock:1" in field "~layout" of the meta hash)
-- KEYS[1]: meta hash  <prefix>:{<name>}           (see queue_lib for KEYS[1..3])
-- KEYS[2]: holders    <prefix>:{<name>}:holders
-- KEYS[3]: queue      <prefix>:{<name>}:queue
-- KEYS[4]: fence key  <prefix>:{<name>}:fence     the last fencing token, or an older one than
--                                                ~fence (see queue_acquire_fast)
-- ARGV[1]: layout tag
-- ARGV[2]: op: x (fair mutex), r (read), w (write), s (permits)
-- ARGV[3]: owner token
-- ARGV[4]: units: permits wanted for s, else 1
-- ARGV[5]: capacity for s (must match the stored one), else 0
-- ARGV[6]: lease in milliseconds
-- ARGV[7]: grace in milliseconds: the first term of a hold handed to this waiter (cut from the
--          lease); 0 = do not queue (try once)
-- ARGV[8]: lifetime of the fence key in milliseconds
-- ARGV[9]: wake-up channel <prefix>:{<name>}:wake
-- ARGV[10]: claim: new (a token made for this call: if it already holds, an earlier attempt's
--           answer was lost, and that hold is returned with a new token, its lease made the
--           full lease from now),
--           queued (the same, for a waiter that queued earlier: it keeps its place), queued-as
--           (a carried owner's waiter that queued earlier: as queued, but a hold it finds once
--           its place is gone is the one handed to it only while marked with its client; any
--           other is the owner's hold through another wait, which it joins), as (join the
--           owner's holds, or acquire) or again (re-entry only: add a hold only if the owner
--           holds)
-- ARGV[11]: client id (the waiter's member starts with it; see queue_lib)
-- returns: {1, fence, holds, now}  acquired; fence is 0 for read holds; holds is the owner's
--                             hold count of this op after the call (the permits for s); now, the
--                             server clock in µs
--          {0, wait, ticket}  not now: ticket is that of the owner's place in the queue (0 for a
--                             try, ARGV[7] = 0: not queued), and nothing changes without a
--                             wake-up message for `wait` ms (until the earliest lease end, or a
--                             little before; -1: never)
--          {-1, type, i}      KEYS[i] holds foreign data of that Redis type
--          {-2, layout}       the meta hash carries another layout tag
--          {-3, capacity}     the semaphore is in use (held or waited on) with another capacity
--          {-4}               the owner holds a read lock and asked to write (upgrade refused)
local layout, op, owner = ARGV[1], ARGV[2], ARGV[3]
local units, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local lease, grace, channel, claim = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[9], ARGV[10]
local client = ARGV[11]

local s, err = open(KEYS, layout, {'~layout', '~next', '~exp', '~cap', '~used', '~fence',
                                   '~seq', '~writer', 'h:' .. owner},
                   claim == 'new' and owner or nil)
if not s then return err end
s.ttl, s.cap, s.channel = ARGV[8], cap, channel
local clock = redis.call('TIME')
local now = now_ms(clock)
if not s.exists then
  s.v['~cap'] = ARGV[5]
elseif op == 's' and num(s, '~cap') ~= cap then
  -- The stored capacity is the name's while it is in use: once the leases ran out and nobody
  -- waits (the keys outlive the last lease end until their expiry), it is this call's to set.
  s.cap = num(s, '~cap')
  if purge(s, now) > 0 then handoff(s, channel, now, clock) end
  if held(s) or redis.call('ZCARD', s.q) > 1 then return finish(s, {-3, s.cap}) end
  put(s, '~cap', ARGV[5])
  s.cap = cap
end
-- A grant's reply, with the server clock in µs (the client's estimate of it starts from there).
local function granted(reply)
  reply[4] = string.format('%d', tonumber(clock[1]) * 1000000 + tonumber(clock[2]))
  return finish(s, reply)
end
local place = member(client, owner, op, ARGV[4], ARGV[6], ARGV[7])
-- A waiter that asks again (it missed its message, or its timer ran out) may have been handed
-- the lock already, or be at a head that could go: whatever ran out or fits goes first.
-- `queued` holds the ticket of the waiter's place while it is in the queue.
local requeued = claim == 'queued' or claim == 'queued-as'
local queued = requeued and redis.call('ZSCORE', s.q, place)
local purged = purge(s, now)
if purged > 0 or queued then handoff(s, channel, now, clock) end
-- A purge takes the waiters of a client that let a lease run out (maybe this one's), and the
-- hand-over may have just given this waiter its hold.
if queued then queued = redis.call('ZSCORE', s.q, place) end

local writer = get(s, '~writer')
local reads, fence = shares(s, owner)

-- A new owner that already holds: the answer to an earlier attempt was lost, or a hand-over
-- came first. Return that hold, its lease made the full lease from now (the owner counts it
-- from this call). A queued waiter whose place is still in the queue was handed nothing: if
-- its (carried) owner holds, that is another wait's hold, and it re-enters below.
-- A `new` claim's hold gets a new token: the client may not have seen its token confirmed (a
-- hold taken in plain commands whose fence key did not confirm it, and then asked for again).
-- A carried owner's place can also go without a hand-over (force-unlock, expiry, a purge):
-- then the hold it finds was taken through another wait of the owner (another client's), and
-- it joins that hold below; only a hold still marked with its client was handed to it.
local handed = claim ~= 'queued-as'
if not handed then
  local _, _, c = shares(s, owner)
  handed = (writer == owner and get(s, '~wclient') == client) or c == client
end
if claim == 'new' or (requeued and not queued and handed) then
  local renew = claim == 'new' and op ~= 'r'
  if (op == 'x' or op == 'w') and writer == owner then
    answered(s, owner, now + lease)
    if renew then
      local token = mint(s, clock)
      if token == nil then return finish(s, {-1, redis.call('TYPE', s.f)['ok'], 4}) end
      put(s, '~wfence', token)
    end
    return granted({1, get(s, '~wfence'), num(s, '~wholds')})
  end
  if (op == 'r' or op == 's') and reads then
    answered(s, owner, now + lease)
    if renew then
      local token = mint(s, clock)
      if token == nil then return finish(s, {-1, redis.call('TYPE', s.f)['ok'], 4}) end
      local _, _, c = shares(s, owner)
      put(s, 'h:' .. owner, reads .. '/' .. token .. '/' .. c)
      fence = token
    end
    if fence == '' then fence = 0 end
    return granted({1, fence, reads})
  end
end

-- Re-entry never waits: the owner already holds the lock (and leaves the queue, if it was in it).
local function reenter()
  if queued then redis.call('ZREM', s.q, place) end
end
if (op == 'x' or op == 'w') and writer == owner then
  reenter()
  local holds = num(s, '~wholds') + 1
  put(s, '~wholds', holds)
  if now + lease > num(s, '~wexp') then
    put(s, '~wexp', now + lease)
    deadline(s, now + lease)
  end
  return granted({1, get(s, '~wfence'), holds})
end
if op == 'r' and (reads or writer == owner) then
  reenter()
  share(s, owner, 1, now + lease, '', nil)
  return granted({1, 0, (reads or 0) + 1})
end
if op == 'w' and reads then return finish(s, {-4}) end
if claim == 'again' then return finish(s, {0, -1, 0}) end

-- A newcomer goes at once when nobody waits and it fits. At rest the head of a queue is never
-- one that could go (releases and purges hand over at once), so a queue means waiting.
if not queued and fits(s, {op = op, n = units})
    and (s.empty or redis.call('ZCARD', s.q) <= 1) then
  local token = 0
  if op ~= 'r' then
    token = mint(s, clock)
    if token == nil then return finish(s, {-1, redis.call('TYPE', s.f)['ok'], 4}) end
  end
  return granted({1, take(s, owner, op, units, now + lease, token, ''), units})
end

if grace > 0 and not queued then
  queued = ticket(s, clock)
  local added = redis.call('ZADD', s.q, 'NX', queued, place, '+inf', '~')
  if added == 2 then s.fresh[s.q] = true end
  -- Queued already by an earlier attempt whose answer was lost: it keeps its place.
  if added == 0 then queued = redis.call('ZSCORE', s.q, place) end
  s.wrote = true
end
local wait = -1
if s.next then wait = s.next - now end
return finish(s, {0, wait, tonumber(queued or 0)})
