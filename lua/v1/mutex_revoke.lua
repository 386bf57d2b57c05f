-- name:    mutex_revoke
-- layout:  1 (the held mutex is the string "mutex:2" of mutex_lib; the request log a hash of
--          once_lib)
-- Undoes, on one Redlock node, a carried owner's acquisition (claim `as` or `again`) that
-- failed: the hold that request added here, if it ran and granted, is released, and the
-- request is logged as refused, so that one still on its way (a node that had not answered
-- when the attempt gave up) finds the entry and changes nothing. The owner's other holds stay.
-- Sent after the acquisition on the node's connection, it runs after it whenever that was sent.
-- KEYS[1]: lock         <prefix>:{<name>}
-- KEYS[2]: request log  <prefix>:{<name>}:once (once_lib: '~' -> 'once:2', request id ->
--                       '<server ms>:' and the packed reply)
-- ARGV[1]: owner token
-- ARGV[2]: the acquisition's request id
-- returns: 1             the hold the request added was released
--          0             nothing to undo: the request did not grant here (or has not run, and
--                        now never will), or the owner holds nothing any more; a log key that
--                        is not ours is left alone, and so is the lock
--          {-1, type, 1} KEYS[1] holds foreign data of that Redis type
--          {-2, layout}  KEYS[1] holds another layout
local lock, log, owner, id = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local ONCE_MS, ONCE_MARK = 10000, 'once:2'
local kind = redis.call('TYPE', log)['ok']
if kind == 'hash' then
  if redis.call('HGET', log, '~') ~= ONCE_MARK then return 0 end
elseif kind ~= 'none' then
  return 0
end
local seen = kind == 'hash' and redis.call('HGET', log, id)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Refused: {0, -2} is mutex_acquire's answer to a re-entry of an owner that holds nothing.
redis.call('HSET', log, '~', ONCE_MARK, id,
  string.format('%.0f', now) .. ':' .. cmsgpack.pack({0, -2}))
redis.call('PEXPIRE', log, ONCE_MS)
if not seen then return 0 end
local reply = cmsgpack.unpack(string.sub(seen, string.find(seen, ':', 1, true) + 1))
if type(reply) ~= 'table' or tonumber(reply[1]) ~= 1 then return 0 end
local held, bad = mutex_read(lock, 1)
if bad then return bad end
if not held or held.owner ~= owner then return 0 end
if held.holds > 1 then
  redis.call('SET', lock, mutex_value(held.token, held.holds - 1, held.wait, owner), 'KEEPTTL')
else
  redis.call('DEL', lock)
end
return 1
