-- name:    mutex_confirm
-- layout:  1 (the held mutex is the string "mutex:2" of mutex_lib; the fence key a sorted set,
--          keys_lib)
-- The second round of a Redlock acquisition's fencing (see the README's Redlock section): the
-- client took the highest counter that its majority of nodes returned as the token, and raises
-- each node's counter to it, only where this owner still holds the lock. Any later acquisition
-- granted by a majority shares a node with this one's confirming majority, reads a counter at
-- least this token there, and so gets a higher one.
-- KEYS[1]: lock        <prefix>:{<name>}
-- KEYS[2]: fence key   <prefix>:{<name>}:fence
-- ARGV[1]: owner token
-- ARGV[2]: the token (a decimal number)
-- ARGV[3]: lifetime of the fence key in milliseconds, from now
-- returns: 1             confirmed: the counter and the hold's token are at least the token
--          0             this owner does not hold the lock here: nothing changed
--          {-1, type, i} KEYS[i] holds foreign data of that Redis type
--          {-2, layout}  KEYS[1] holds another layout
local lock, fence = KEYS[1], KEYS[2]
local owner, token = ARGV[1], tonumber(ARGV[2])

local held, bad = mutex_read(lock, 1)
if bad then return bad end
if not held or held.owner ~= owner then return 0 end
local bad = fence_last(fence, 2, true)
if bad then return bad end
fence_raise(fence, ARGV[2], ARGV[3])
redis.call('PEXPIRE', fence, ARGV[3])
if tonumber(held.token) < token then
  redis.call('SET', lock, mutex_value(ARGV[2], held.holds, held.wait, owner), 'KEEPTTL')
end
return 1
