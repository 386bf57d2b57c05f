-- name:    queue_extend
-- layout:  1 (see queue_acquire)
-- KEYS[4i-3..4i]: meta hash, holders, queue and timeouts of item i (see queue_lib); the
--                 watchdog batches holds and queued waiters of many names in one call
-- ARGV[4i-3]: layout tag of item i
-- ARGV[4i-2]: h (a hold: renew its lease) or q (a waiter: push back its eviction deadline)
-- ARGV[4i-1]: owner token
-- ARGV[4i]:   milliseconds; the lease (or deadline) becomes at least this far from now
-- returns: one integer per item:
--           1  extended (or it already ran longer)
--           0  not held (not queued) by this owner any more: expired, released or evicted
--          -1  a key holds foreign data
--          -2  the meta hash carries another layout tag
local now = now_ms()
local out = {}
for i = 1, #KEYS / 4 do
  local b = 4 * (i - 1)
  local s = {m = KEYS[b + 1], h = KEYS[b + 2], q = KEYS[b + 3], t = KEYS[b + 4], i = b + 1}
  local layout, what, owner = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local err = check(s, layout)
  if err then
    out[i] = err[1]
  else
    local set = s.h
    if what == 'q' then set = s.t end
    local at = tonumber(redis.call('ZSCORE', set, owner))
    if at and at > now then
      redis.call('ZADD', set, 'GT', now + tonumber(ARGV[b + 4]), owner)
      touch(s)
      out[i] = 1
    else
      out[i] = 0
    end
  end
end
return out
