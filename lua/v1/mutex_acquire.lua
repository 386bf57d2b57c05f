-- name:    mutex_acquire
-- layout:  1 (the held mutex is the string "mutex:2" of mutex_lib; the fence key a sorted set,
--          keys_lib)
-- KEYS[1]: lock        <prefix>:{<name>}        the held mutex (mutex_lib), its TTL the lease
-- KEYS[2]: fence key   <prefix>:{<name>}:fence  last fencing token issued for this name (keys_lib)
-- ARGV[1]: owner token
-- ARGV[2]: lease in milliseconds
-- ARGV[3]: lifetime of the fence key in milliseconds, from the last token this script issued
--          (the one-round-trip acquire below keeps the key's TTL)
-- ARGV[4]: claim: new (a token made for this call: if it already holds, an earlier attempt's
--          answer was lost, and that hold is returned with a new token, its lease made at
--          least ARGV[2] again),
--          as (join the owner's holds, or take the lock) or again (re-entry only: add a hold
--          only if the owner holds)
-- ARGV[5]: 'w' when other waiters of this client wait for the lock (the grant is marked so
--          that its release publishes a wake-up), else '-'
-- ARGV[6]: the least token to issue: the client's estimate of the server clock in µs (a
--          Redlock client's proposal, the same to every node), or 0 for the server clock
--          (TIME), when the client has no estimate. The token is max(last + 1, ARGV[6]); a new
--          counter (first use, expired 7 days after the last token this script issued, or
--          lost in a failover) starts
--          at the server clock plus one second, so tokens keep rising across it.
-- ARGV[7]: optional, how many tokens a fresh acquisition takes at most (default 1): the
--          grant's token and up to ARGV[7] - 1 after it, which the client hands to the local
--          owners it passes the hold to (local hand-off); the fence key is left at the last of
--          them. They end at most one second (1,000,000 tokens) past the floor (ARGV[6], or the
--          server clock), where a new counter starts: however many passes a hold reserves and
--          however often, they never carry the counter further ahead of the clock than that
--          (and the client's estimate's lead), and a counter that runs that far ahead takes
--          no more than its token.
-- A fresh acquisition of a free lock is two commands: SET NX PX of the lock with the token
-- ARGV[6], then ZADD XX GT CH of the fence key, which raises its last token to it only if it is
-- higher (the client's one-round-trip acquire, protocol/mutex.rs, sends the same two commands
-- without the script). Only when the fence key stood at or above it (or is new, or is the
-- counter of the layout before) is the token raised above the last one, and the lock and the
-- fence key written again; a fence key that is not ours is left as it was and the lock removed,
-- so nothing changed. A busy lock leaves the fence key alone.
-- A fresh owner (claim new) that finds its own hold, whose answer was lost (or whose token the
-- one-round-trip acquire could not confirm), gets a new token above every one issued.
-- returns: {1, fence, holds[, now[, last]]}  acquired; holds is this owner's hold count after
--                                    the call; now, the server clock in µs, when TIME was read
--                                    (else false, when last follows); last, the last token of
--                                    the block taken, when ARGV[7] asked for more than one
--          {0, pttl[, last]}  held by another owner; pttl is its remaining lease in ms (-2:
--                             free, but the claim was `again` and the owner holds nothing);
--                             last, the fence key's last token when it has one: a waiter's
--                             attempt after the release proposes a token above it
--          {-1, type, i}      KEYS[i] holds foreign data of that Redis type
--          {-2, layout}       KEYS[1] holds another layout
local lock, fence = KEYS[1], KEYS[2]
local owner, lease, claim, wait = ARGV[1], ARGV[2], ARGV[4], ARGV[5]

local floor, now = tonumber(ARGV[6]) or 0, nil
local extra = math.max((tonumber(ARGV[7]) or 1) - 1, 0)
-- How far past the floor a block of tokens may end (µs): a new counter's head start.
local SPAN = 1000000
if floor <= 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  floor = now
end

-- How many of the `extra` tokens a block starting at `first` takes: those up to SPAN past the
-- floor.
local function more(first)
  return math.max(math.min(extra, floor + SPAN - first), 0)
end

-- Issues `token` (a decimal string, at least the floor) to the hold now under the lock: the
-- fence key is raised to it and the block's tokens after it (`more`). If the key already stood
-- at or above it, the token is the next one above the key; a new key (the name's first use, or
-- its counter expired or was lost in a failover) starts at the server clock plus one second,
-- above any token a client issued from its estimate of the clock, which runs ahead of it by far
-- less. Returns the token issued and the last of its block, or nil and the error reply for a
-- fence key that is not ours.
local function issue(token)
  if redis.pcall('ZADD', fence, 'XX', 'GT', 'CH', token, '~') == 1 then
    local first = tonumber(token)
    local n = more(first)
    if n > 0 then
      redis.call('ZADD', fence, 'XX', 'GT', string.format('%.0f', first + n), '~')
    end
    redis.call('PEXPIRE', fence, ARGV[3])
    return token, first + n
  end
  local bad, last = fence_last(fence, 2, true)
  if bad then return nil, bad end
  local first = tonumber(token)
  if last then
    first = math.max(first, last + 1)
  else
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    first = math.max(first, now + 1000000)
  end
  local n = more(first)
  fence_raise(fence, string.format('%.0f', first + n), ARGV[3])
  if last then redis.call('PEXPIRE', fence, ARGV[3]) end
  return string.format('%.0f', first), first + n
end

-- The reply to a grant of `token`, with the server clock when this call read it, and the last
-- token of the block taken (`last`; the token itself when none was) when more were asked for.
local function granted(token, holds, last)
  local reply = {1, token, holds}
  if now then reply[4] = string.format('%.0f', now) end
  if extra > 0 then
    reply[4] = reply[4] or false
    reply[5] = string.format('%.0f', last or tonumber(token))
  end
  return reply
end

if claim ~= 'again' then
  -- The token is ARGV[6] as the client wrote it when that is a plain whole number (the usual
  -- case: no formatting), else the floor written out.
  local token = not now and string.match(ARGV[6], '^[1-9]%d*$') or string.format('%.0f', floor)
  local taken = redis.pcall('SET', lock, mutex_value(token, 1, wait, owner), 'NX', 'PX', lease)
  if type(taken) == 'table' and taken.err then return taken end
  if taken then
    local issued, last = issue(token)
    if not issued then
      redis.call('DEL', lock)
      return last
    end
    if issued ~= token then
      redis.call('SET', lock, mutex_value(issued, 1, wait, owner), 'KEEPTTL')
    end
    return granted(issued, 1, last)
  end
end

local held, bad = mutex_read(lock, 1)
if bad then return bad end
if not held then return {0, -2} end
if held.owner == owner then
  local token, holds, last = held.token, held.holds, nil
  if claim == 'new' then
    -- The same acquisition asked again: its hold keeps its count and gets a new token (or,
    -- with a fence key that is not ours, is given back).
    local issued, block = issue(string.format('%.0f', math.max(floor, tonumber(token) + 1)))
    if not issued then
      redis.call('DEL', lock)
      return block
    end
    token, last = issued, block
  else
    holds = holds + 1
  end
  redis.call('SET', lock, mutex_value(token, holds, held.wait, owner), 'KEEPTTL')
  if redis.call('PTTL', lock) < tonumber(lease) then redis.call('PEXPIRE', lock, lease) end
  return granted(token, holds, last)
end
if held.wait ~= 'w' then
  -- A waiter: the holder's release will publish.
  redis.call('SET', lock, mutex_value(held.token, held.holds, 'w', held.owner), 'KEEPTTL')
end
local last = redis.pcall('ZSCORE', fence, '~')
if type(last) == 'string' then return {0, redis.call('PTTL', lock), last} end
return {0, redis.call('PTTL', lock)}
