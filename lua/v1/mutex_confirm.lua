-- name:    mutex_confirm
-- layout:  1
-- The second round of a Redlock acquisition's fencing (see the README's Redlock section): the
-- client took the highest counter that its majority of nodes returned as the token, and raises
-- each node's counter to it, only where this owner still holds the lock. Any later acquisition
-- granted by a majority shares a node with this one's confirming majority, reads a counter at
-- least this token there, and so gets a higher one.
-- KEYS[1]: lock hash   <prefix>:{<name>}
-- KEYS[2]: fence key   <prefix>:{<name>}:fence
-- ARGV[1]: owner token
-- ARGV[2]: the token (a decimal number)
-- ARGV[3]: lifetime of the fence key in milliseconds
-- returns: 1             confirmed: the counter and the hash's "~fence" are at least the token
--          0             this owner does not hold the lock here: nothing changed
--          {-1, type, i} KEYS[i] holds foreign data of that Redis type
--          {-2, layout}  the lock hash carries another layout tag
local LAYOUT = 'mutex:1'
local lock, fence = KEYS[1], KEYS[2]
local owner, token = ARGV[1], tonumber(ARGV[2])

local kind = redis.call('TYPE', lock)['ok']
if kind == 'none' then return 0 end
if kind ~= 'hash' then return {-1, kind, 1} end
local layout = redis.call('HGET', lock, '~layout')
if layout ~= LAYOUT then return {-2, layout or ''} end
if redis.call('HEXISTS', lock, owner) == 0 then return 0 end

local fkind = redis.call('TYPE', fence)['ok']
local last = 0
if fkind == 'string' then
  last = tonumber(redis.call('GET', fence))
  if last == nil then return {-1, 'string', 2} end
elseif fkind ~= 'none' then
  return {-1, fkind, 2}
end
if last < token then
  redis.call('SET', fence, ARGV[2], 'PX', ARGV[3])
end
if (tonumber(redis.call('HGET', lock, '~fence')) or 0) < token then
  redis.call('HSET', lock, '~fence', ARGV[2])
end
return 1
