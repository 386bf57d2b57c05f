-- name:    mutex_release
-- layout:  1
-- KEYS[1]: lock hash   <prefix>:{<name>}
-- ARGV[1]: owner token
-- ARGV[2]: wake-up channel <prefix>:{<name>}:wake (published to when the lock becomes free)
-- ARGV[3]: optional message to publish (default '1'; '' publishes nothing); a Redlock client's
--          release sends the same `1@<release id>` to every node, so a waiter that hears it from
--          several nodes wakes once, and gives back a failed attempt's grants with ''
-- returns: {1, holds}    one hold released; the owner still holds the lock `holds` times
--          {2}           the last hold released; the lock is free and waiters were told
--          {0}           not held by this owner: nothing changed
--          {-1, type, 1} KEYS[1] holds foreign data of that Redis type
--          {-2, layout}  the lock hash carries another layout tag
local LAYOUT = 'mutex:1'
local lock, owner = KEYS[1], ARGV[1]

local kind = redis.call('TYPE', lock)['ok']
if kind == 'none' then return {0} end
if kind ~= 'hash' then return {-1, kind, 1} end
local layout = redis.call('HGET', lock, '~layout')
if layout ~= LAYOUT then return {-2, layout or ''} end

local holds = tonumber(redis.call('HGET', lock, owner))
if holds == nil then return {0} end
if holds > 1 then return {1, redis.call('HINCRBY', lock, owner, -1)} end
redis.call('DEL', lock)
local message = ARGV[3] or '1'
if message ~= '' then redis.call(PUBLISH, ARGV[2], message) end
return {2}
