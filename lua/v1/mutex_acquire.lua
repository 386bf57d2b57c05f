-- name:    mutex_acquire
-- layout:  1 (the held mutex is the string "mutex:2" of mutex_lib)
-- KEYS[1]: lock        <prefix>:{<name>}        the held mutex (mutex_lib), its TTL the lease
-- KEYS[2]: fence key   <prefix>:{<name>}:fence  last fencing token issued for this name
-- ARGV[1]: owner token
-- ARGV[2]: lease in milliseconds
-- ARGV[3]: lifetime of the fence key in milliseconds (set when the counter starts afresh)
-- ARGV[4]: claim: new (a token made for this call: if it already holds, an earlier attempt's
--          answer was lost, and that hold is returned, its lease made at least ARGV[2] again),
--          as (join the owner's holds, or take the lock) or again (re-entry only: add a hold
--          only if the owner holds)
-- ARGV[5]: 'w' when other waiters of this client wait for the lock (the grant is marked so
--          that its release publishes a wake-up), else '-'
-- ARGV[6]: the least token to issue: the client's estimate of the server clock in µs (a
--          Redlock client's proposal, the same to every node), or 0 for the server clock
--          (TIME), when the client has no estimate. The token is max(last + 1, ARGV[6]); a new
--          counter (first use, expired 7 days after it was made, or lost in a failover) starts
--          at the server clock plus one second, so tokens keep rising across it.
-- ARGV[7]: optional, how many tokens a fresh acquisition takes (default 1): the grant's token
--          and the ARGV[7] - 1 after it, which the client hands to the local owners it passes
--          the hold to (local hand-off); the counter is left at the last of them.
-- A fresh acquisition of a free lock is two commands: SET NX PX of the lock with the token
-- ARGV[6], then SET ... KEEPTTL GET of the counter (it reads the last token and writes the new
-- one). Only when the counter was at or above ARGV[6] (or new) is the token raised, and the
-- lock and counter written again; a counter that is not ours is put back as it was and the
-- lock removed, so nothing changed. A busy lock leaves the counter alone.
-- returns: {1, fence, holds[, now]}  acquired; holds is this owner's hold count after the
--                                    call; now, the server clock in µs, when TIME was read
--          {0, pttl}          held by another owner; pttl is its remaining lease in ms (-2:
--                             free, but the claim was `again` and the owner holds nothing)
--          {-1, type, i}      KEYS[i] holds foreign data of that Redis type
--          {-2, layout}       KEYS[1] holds another layout
local lock, fence = KEYS[1], KEYS[2]
local owner, lease, claim, wait = ARGV[1], ARGV[2], ARGV[4], ARGV[5]

local floor, now = tonumber(ARGV[6]) or 0, nil
local extra = math.max((tonumber(ARGV[7]) or 1) - 1, 0)
if floor <= 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  floor = now
end

if claim ~= 'again' then
  -- The token is ARGV[6] as the client wrote it when that is a plain whole number (the usual
  -- case: no formatting), else the floor written out.
  local token = not now and string.match(ARGV[6], '^[1-9]%d*$') or string.format('%.0f', floor)
  local taken = redis.pcall('SET', lock, mutex_value(token, 1, wait, owner), 'NX', 'PX', lease)
  if type(taken) == 'table' and taken.err then return taken end
  if taken then
    local counter = extra > 0 and string.format('%.0f', floor + extra) or token
    local prev = redis.pcall('SET', fence, counter, 'KEEPTTL', 'GET')
    local last = type(prev) == 'string' and tonumber(prev)
    if type(prev) == 'table' or (prev and not last) then
      -- Not a counter of ours (a string is put back as it was): refused, the lock undone.
      -- Any other failure (OOM...) is the caller's to see.
      redis.call('DEL', lock)
      if type(prev) == 'string' then
        redis.call('SET', fence, prev, 'KEEPTTL')
        return {-1, 'string', 2}
      end
      if not string.find(prev.err, 'WRONGTYPE', 1, true) then return prev end
      return {-1, redis.call('TYPE', fence)['ok'], 2}
    end
    if not prev then
      -- A new counter (the name's first use, or its counter expired or a failover lost it):
      -- from the server clock a second ahead, above any token a client issued from its
      -- estimate of the clock, which runs ahead of it by far less.
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000000 + tonumber(t[2])
      local first = math.max(floor, now + 1000000)
      token = string.format('%.0f', first)
      redis.call('SET', fence, string.format('%.0f', first + extra), 'PX', ARGV[3])
      redis.call('SET', lock, mutex_value(token, 1, wait, owner), 'KEEPTTL')
    elseif last >= floor then
      token = string.format('%.0f', last + 1)
      redis.call('SET', fence, string.format('%.0f', last + 1 + extra), 'KEEPTTL')
      redis.call('SET', lock, mutex_value(token, 1, wait, owner), 'KEEPTTL')
    end
    if now then return {1, token, 1, string.format('%.0f', now)} end
    return {1, token, 1}
  end
end

local held, bad = mutex_read(lock, 1)
if bad then return bad end
if not held then return {0, -2} end
if held.owner == owner then
  local holds = held.holds
  if claim ~= 'new' then
    -- The same acquisition asked again (claim new, its answer was lost) keeps its count.
    holds = holds + 1
    redis.call('SET', lock, mutex_value(held.token, holds, held.wait, owner), 'KEEPTTL')
  end
  if redis.call('PTTL', lock) < tonumber(lease) then redis.call('PEXPIRE', lock, lease) end
  return {1, held.token, holds}
end
if held.wait ~= 'w' then
  -- A waiter: the holder's release will publish.
  redis.call('SET', lock, mutex_value(held.token, held.holds, 'w', held.owner), 'KEEPTTL')
end
return {0, redis.call('PTTL', lock)}
