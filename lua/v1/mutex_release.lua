-- name:    mutex_release
-- layout:  1 (the held mutex is the string "mutex:2" of mutex_lib)
-- KEYS[1]: lock        <prefix>:{<name>}
-- ARGV: either (owner token, channel[, message[, string]]) as below, or the lock's string as
--       the releaser's grant wrote it alone: the owner is its last field, the channel the lock's
--       key and `:wake`, the message '1'
-- ARGV[1]: owner token
-- ARGV[2]: wake-up channel <prefix>:{<name>}:wake (published to when the lock becomes free and
--          a waiter had found it busy)
-- ARGV[3]: optional message to publish (default '1'; '' publishes nothing); a Redlock client's
--          release sends the same `1@<release id>` to every node, so a waiter that hears it from
--          several nodes wakes once, and gives back a failed attempt's grants with ''
-- ARGV[4]: optional, the lock's string as the releaser's grant wrote it: when the lock is
--          exactly that, mutex_release_fast has deleted it before this script runs
-- returns: {1, holds}    one hold released; the owner still holds the lock `holds` times
--          {2, told}     the last hold released; the lock is free; told is 1 when a waiter
--                        had found it busy and the release published (0: nobody was told);
--                        the integer 2 from mutex_release_fast stands for {2, 0}
--          {0}           not held by this owner: nothing changed
--          {-1, type, 1} KEYS[1] holds foreign data of that Redis type
--          {-2, layout}  KEYS[1] holds another layout
local lock, owner, channel, message = KEYS[1], ARGV[1], ARGV[2], ARGV[3] or '1'
if #ARGV == 1 then
  owner, channel, message = string.match(ARGV[1], ' (%S+)$') or '', lock .. ':wake', '1'
end

local held, bad = mutex_read(lock, 1)
if bad then return bad end
if not held or held.owner ~= owner then return {0} end
if held.holds > 1 then
  redis.call('SET', lock, mutex_value(held.token, held.holds - 1, held.wait, owner), 'KEEPTTL')
  return {1, held.holds - 1}
end
redis.call('DEL', lock)
if held.wait == 'w' and message ~= '' then
  redis.call(PUBLISH, channel, message)
  return {2, 1}
end
return {2, 0}
