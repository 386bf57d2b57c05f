-- name:    queue_release
-- layout:  1 (see queue_acquire)
-- KEYS[1]: meta hash  <prefix>:{<name>}           (see queue_lib for KEYS[1..3])
-- KEYS[2]: holders    <prefix>:{<name>}:holders
-- KEYS[3]: queue      <prefix>:{<name>}:queue
-- KEYS[4]: fence key  <prefix>:{<name>}:fence     (written when the name goes idle with a
--                                                newer token in ~fence)
-- ARGV[1]: layout tag
-- ARGV[2]: op: x (fair mutex), r (read), w (write), s (a permit: all its units), q (leave the
--          queue: a waiter gave up; if a hand-over already gave its owner a hold that nobody
--          answered, release that one hold: for owners the caller carried), Q (leave the queue,
--          and if a hand-over already made the owner a holder, release that hold: for owners
--          made for the wait that ends)
-- ARGV[3]: owner token; for q and Q the waiter's queue member (see queue_lib)
-- ARGV[4]: wake-up channel <prefix>:{<name>}:wake
-- ARGV[5]: lifetime of the fence key in milliseconds
-- ARGV[6]: optional, the thin form's string as the releaser's grant wrote it: when the meta key
--          is exactly that, queue_release_thin has deleted it before this script runs
-- Whatever the call frees is handed over at once: every waiter that becomes grantable gets its
-- hold in this script and is told on the channel (`owner:fence:ms`, space-separated; see
-- handoff in queue_lib; `client/owner:fence:ms`).
-- returns: {1, holds}      one hold released; the owner still holds `holds` of this op
--          {2, idle}       the owner's last hold of this op released (for Q: the hold a
--                          hand-over gave it); idle is 1 when nobody holds or waits now
--          {3}             the waiter left the queue
--          {0}             not held (or not queued) by this owner: nothing changed
--          {-1, type, i}   KEYS[i] holds foreign data of that Redis type
--          {-2, layout}    the meta hash carries another layout tag
local layout, op, owner, channel = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local s, err = open(KEYS, layout, {'~layout', '~next', '~exp', '~cap', '~used', '~fence',
                                   '~writer', '~wholds', 'h:' .. owner})
if not s then return err end
if not s.exists then return {0} end
s.ttl, s.channel = ARGV[5], channel

local clock = redis.call('TIME')
local now = now_ms(clock)
local purged = purge(s, now)
local writer = get(s, '~writer')
local out = {0}
if op == 'q' or op == 'Q' then
  if redis.call('ZREM', s.q, owner) == 1 then
    out = {3}
  elseif op == 'Q' then
    -- A fresh owner holds one kind of hold at most: whichever a hand-over gave it.
    local o = waiter(owner).owner
    if writer == o then
      unwrite(s)
      out = {2}
    end
    if unshare(s, o) then out = {2} end
  else
    -- A carried owner may hold more: only the hold a hand-over gave this waiter goes, known by
    -- the mark of its client that its answer would have cleared. A client waits for one owner
    -- at one name in one place at a time, so the mark is this waiter's.
    local w = waiter(owner)
    if writer == w.owner and get(s, '~wclient') == w.client then
      local n = num(s, '~wholds') - 1
      if n > 0 then put(s, '~wholds', n) else unwrite(s) end
      out = {2}
    else
      local n, _, c = shares(s, w.owner)
      if n and c ~= '' and c == w.client then
        if w.op == 'r' and n > 1 then
          put(s, 'h:' .. w.owner, (n - 1) .. '//')
          put(s, '~used', num(s, '~used') - 1)
        else
          unshare(s, w.owner)
        end
        out = {2}
      end
    end
  end
elseif op == 's' then
  if unshare(s, owner) then out = {2} end
elseif op == 'r' then
  local n, _, c = shares(s, owner)
  if n then
    put(s, '~used', num(s, '~used') - 1)
    if n > 1 then
      put(s, 'h:' .. owner, (n - 1) .. '//' .. c)
      out = {1, n - 1}
    else
      drop(s, 'h:' .. owner)
      unlist(s, owner)
      out = {2}
    end
  end
elseif writer == owner then
  local n = num(s, '~wholds') - 1
  if n > 0 then
    put(s, '~wholds', n)
    out = {1, n}
  else
    unwrite(s)
    out = {2}
  end
end
-- Only a last hold, a waiter leaving or a purge can let anyone through.
if out[1] >= 2 or purged > 0 then handoff(s, channel, now, clock) end
local reply = finish(s, out)
if reply[1] == 2 and s.idle then reply[2] = 1 end
return reply
