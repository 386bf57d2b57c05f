-- name:    once_lib
-- layout:  1 (no layout of its own: a request log beside the name's keys)
-- On Redis Cluster the client re-sends a request whose reply it lost (a connection reset, a
-- timeout), so a script can run twice. The cluster form of the scripts that change hold counts
-- (mutex_acquire, mutex_release, queue_acquire, queue_release) runs the script's own code as
-- `main` through this wrapper, which runs it once per request id and answers a repeat with the
-- first run's reply.
-- KEYS[#KEYS]: request log <prefix>:{<name>}:once, a hash of request id -> packed reply; it
--              expires ONCE_MS after it was made (a repeat comes within the client's retry
--              budget, seconds), so a busy name's log never grows past that window's requests
-- ARGV[#ARGV]: request id (random, one per request; a repeat carries the same), or '' for a
--              request that may run twice with the effect of once (an acquisition for a
--              fresh owner finds its own hold the second time): the log is not used
-- Both are removed from KEYS and ARGV before `main` runs, so the script sees its own.
-- returns: what `main` returns, or what it returned the first time for this request id. A log
--          key holding data redlatch did not write is left alone and not used.
local ONCE_MS = 10000
local once_key = table.remove(KEYS)
local once_id = table.remove(ARGV)
if once_id == '' then return main() end
local once_kind = redis.call('TYPE', once_key)['ok']
if once_kind ~= 'hash' and once_kind ~= 'none' then return main() end
local seen = redis.call('HGET', once_key, once_id)
if seen then return cmsgpack.unpack(seen) end
local reply = main()
redis.call('HSET', once_key, once_id, cmsgpack.pack(reply))
if redis.call('PTTL', once_key) < 0 then redis.call('PEXPIRE', once_key, ONCE_MS) end
return reply
