-- name:    once_lib
-- layout:  1 (no layout of its own: a request log beside the name's keys)
-- A request whose reply was lost (a connection reset, a timeout) may be sent again: on Redis
-- Cluster the client re-sends it, and on any server a wait asks again after such an attempt, so
-- a script can run twice. The scripts that change hold counts run their own code as `main`
-- through this wrapper, which runs it once per request id and answers a repeat with the first
-- run's reply: mutex_acquire and queue_acquire in both forms, mutex_release and queue_release
-- in the cluster form.
-- KEYS[#KEYS]: request log <prefix>:{<name>}:once, a hash: '~' -> 'once:2' (the log's mark),
--              and request id -> '<server ms>:' followed by the packed reply. Every entry is
--              kept ONCE_MS at least (a repeat comes within the client's retry budget,
--              seconds): the log's TTL is set to ONCE_MS again on every write, and each write
--              drops the entries older than that among a few drawn at random (as Redis expires
--              keys), so a busy name's log holds about one window of requests
-- ARGV[#ARGV]: request id (random, one per request; a repeat carries the same), or '' for a
--              request that may run twice with the effect of once (an acquisition for a
--              fresh owner finds its own hold the second time): the log is not used
-- Both are removed from KEYS and ARGV before `main` runs, so the script sees its own.
-- Only a reply whose status is above 0 is logged: a grant or a release, which must not happen
-- twice. A refusal (busy, queued, not held, foreign data) changed no hold count, and a repeat
-- runs again, answering from the state as it is then rather than as it was.
-- returns: what `main` returns, or what it returned the first time for this request id. A log
--          key holding data redlatch did not write (any other type, or a hash without the
--          mark) is left alone and not used.
local ONCE_MS = 10000
local ONCE_MARK = 'once:2'
local once_key = table.remove(KEYS)
local once_id = table.remove(ARGV)
if once_id == '' then return main() end
local once_kind = redis.call('TYPE', once_key)['ok']
if once_kind == 'hash' then
  if redis.call('HGET', once_key, '~') ~= ONCE_MARK then return main() end
  local seen = redis.call('HGET', once_key, once_id)
  if seen then
    return cmsgpack.unpack(string.sub(seen, string.find(seen, ':', 1, true) + 1))
  end
elseif once_kind ~= 'none' then
  return main()
end
local reply = main()
-- A status: the first field of a table reply, or the reply itself (a release's fast path
-- answers a bare integer).
local status = type(reply) == 'table' and tonumber(reply[1]) or tonumber(reply)
if not status or status <= 0 then return reply end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local drawn = redis.call('HRANDFIELD', once_key, 3, 'WITHVALUES')
for i = 1, #drawn, 2 do
  local at = tonumber(string.match(drawn[i + 1], '^(%d+):'))
  if at and now - at > ONCE_MS then redis.call('HDEL', once_key, drawn[i]) end
end
redis.call('HSET', once_key, '~', ONCE_MARK, once_id,
  string.format('%.0f', now) .. ':' .. cmsgpack.pack(reply))
redis.call('PEXPIRE', once_key, ONCE_MS)
return reply
