-- name:    keys_lib
-- layout:  1
-- Prepended to the queue_*, mutex_acquire, mutex_confirm, inspect and force_unlock scripts:
-- tells redlatch's own keys from data it did not write, which every script refuses and leaves
-- exactly as it is.
-- KEYS[]:  none (the function takes its key as a parameter)
-- ARGV[]:  none
-- returns: nothing (a library)
-- Our sorted sets (holders, queue) always carry the member `~` at +inf while they exist; a
-- fence key is a sorted set whose only member `~` has the last fencing token for its score
-- (the layout before kept it as a string holding a decimal number: read as well, and carried
-- over to the sorted set by the scripts that write it).

-- How long a queued primitive's keys outlive the latest lease end, in ms, before the expiry is
-- rounded up to the next whole second. Waiters are told to ask again when a lease ends (plus
-- their jitter and a round trip, or a poll of up to a second while push is down): a holder that
-- died must not take the queue with it, and its waiters their order.
local QUEUE_LINGER_MS = 2000

-- The expiry (server ms) of a queued primitive's keys whose latest lease ends at `top`.
local function queue_expiry(top)
  return (math.floor((top + QUEUE_LINGER_MS) / 1000) + 1) * 1000
end

-- Checks `key` (KEYS[i] of the calling script) against what redlatch keeps there: a sorted set
-- carrying `~`. Returns nil when the key is absent or ours, else the error reply {-1, type, i}.
local function foreign(key, i)
  local t = redis.call('TYPE', key)['ok']
  if t == 'none' then return nil end
  if t ~= 'zset' then return {-1, t, i} end
  if not redis.call('ZSCORE', key, '~') then return {-1, 'zset', i} end
  return nil
end

-- The last fencing token in the fence key `key` (KEYS[i]): nil and the token, or nil and false
-- when the key is absent; the error reply {-1, type, i} for data redlatch did not write. A
-- counter of the layout before (a string holding a decimal number) is read too and, with
-- `carry`, made the sorted set in its place, its TTL kept.
local function fence_last(key, i, carry)
  local v = redis.pcall('ZSCORE', key, '~')
  if type(v) == 'string' then return nil, tonumber(v) end
  if type(v) == 'table' and v.err then
    local t = redis.call('TYPE', key)['ok']
    local old = t == 'string' and redis.call('GET', key)
    if not (old and string.match(old, '^%d+$')) then return {-1, t, i} end
    if carry then
      local ttl = redis.call('PTTL', key)
      redis.call('DEL', key)
      redis.call('ZADD', key, old, '~')
      if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
    end
    return nil, tonumber(old)
  end
  if redis.call('EXISTS', key) == 1 then return {-1, 'zset', i} end
  return nil, false
end

-- Raises the fence key `key` to `token`, a decimal string; a key made here lives `ttl` ms. A
-- counter of the layout before is carried over first. A key that is not ours is left as it
-- was: another type refuses the ZADD, and a sorted set of someone else's that the ZADD gave a
-- `~` (the callers that know the last token already, from the meta hash, do not look first)
-- has it taken out again.
local function fence_raise(key, token, ttl)
  local added = redis.pcall('ZADD', key, 'GT', token, '~')
  if type(added) == 'table' then
    if fence_last(key, 0, true) then return end
    added = redis.call('ZADD', key, 'GT', token, '~')
  end
  if added == 1 then
    if redis.call('ZCARD', key) > 1 then
      redis.call('ZREM', key, '~')
      return
    end
    redis.call('PEXPIRE', key, ttl)
  end
end

-- A queued primitive's single hold, kept as one string under the meta key while nobody else
-- holds or waits (queue_lib's thin form): `<layout> <op> <units> <cap> <token> <owner>`, its
-- TTL the lease. The fields of the string `v`, or nil when it is not of that form.
local function thin_read(v)
  local layout, op, units, cap, token, owner =
    string.match(v, '^(%l+:%d+) ([xwrs]) (%d+) (%d+) (%d+) (%S+)$')
  if not layout then return nil end
  return {layout = layout, op = op, units = tonumber(units), cap = tonumber(cap), token = token,
          owner = owner}
end

-- ==== end of keys_lib ====
