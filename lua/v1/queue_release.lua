-- name:    queue_release
-- layout:  1 (see queue_acquire)
-- KEYS[1]: meta hash  <prefix>:{<name>}           (see queue_lib for KEYS[1..4])
-- KEYS[2]: holders    <prefix>:{<name>}:holders
-- KEYS[3]: queue      <prefix>:{<name>}:queue
-- KEYS[4]: timeouts   <prefix>:{<name>}:timeouts
-- KEYS[5]: fence key  <prefix>:{<name>}:fence     (for the tokens of handed-over holds)
-- ARGV[1]: layout tag
-- ARGV[2]: op: x (fair mutex), r (read), w (write), s (a permit: all its units), q (leave the
--          queue: a waiter gave up), Q (leave the queue, and if a hand-over already made the
--          owner a holder, release that hold: for owners made for the wait that ends)
-- ARGV[3]: owner token
-- ARGV[4]: wake-up channel <prefix>:{<name>}:wake
-- ARGV[5]: lifetime of the fence key in milliseconds
-- Whatever the call frees is handed over at once: every waiter that becomes grantable gets its
-- hold in this script and is told on the channel (`id:fence:ms`, space-separated; see handoff in
-- queue_lib).
-- returns: {1, holds}      one hold released; the owner still holds `holds` of this op
--          {2}             the owner's last hold of this op released (for Q: the hold a
--                          hand-over gave it)
--          {3}             the waiter left the queue
--          {0}             not held (or not queued) by this owner: nothing changed
--          {-1, type, i}   KEYS[i] holds foreign data of that Redis type
--          {-2, layout}    the meta hash carries another layout tag
local s = {m = KEYS[1], h = KEYS[2], q = KEYS[3], t = KEYS[4], i = 1, f = KEYS[5], ttl = ARGV[5]}
local layout, op, owner = ARGV[1], ARGV[2], ARGV[3]

local err, exists = check(s, layout)
if err then return err end
if not exists then return {0} end

local clock = redis.call('TIME')
local now = now_ms(clock)
local purged = purge(s, now)
local writer = redis.call('HGET', s.m, '~writer')
local out = {0}
if op == 'q' or op == 'Q' then
  if redis.call('ZSCORE', s.q, owner) then
    drop_waiter(s, owner)
    out = {3}
  elseif op == 'Q' and (writer == owner or redis.call('HEXISTS', s.m, 'h:' .. owner) == 1) then
    drop_holder(s, owner)
    out = {2}
  end
elseif op == 's' then
  local n = tonumber(redis.call('HGET', s.m, 'h:' .. owner))
  if n then
    drop_holder(s, owner)
    out = {2}
  end
elseif op == 'r' then
  local n = tonumber(redis.call('HGET', s.m, 'h:' .. owner))
  if n then
    redis.call('HINCRBY', s.m, '~used', -1)
    if n > 1 then
      out = {1, redis.call('HINCRBY', s.m, 'h:' .. owner, -1)}
    else
      redis.call('HDEL', s.m, 'h:' .. owner)
      if writer ~= owner then redis.call('ZREM', s.h, owner) end
      out = {2}
    end
  end
elseif writer == owner then
  local n = redis.call('HINCRBY', s.m, '~wholds', -1)
  if n > 0 then
    out = {1, n}
  else
    redis.call('HDEL', s.m, '~writer', '~wholds', '~wfence')
    if redis.call('HEXISTS', s.m, 'h:' .. owner) == 0 then redis.call('ZREM', s.h, owner) end
    out = {2}
  end
end
if out[1] ~= 0 or purged > 0 then handoff(s, ARGV[4], now, clock) end
touch(s)
return out
