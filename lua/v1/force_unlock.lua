-- name:    force_unlock
-- layout:  1 (removes "mutex:2", "fair:1", "semaphore:1", "rwlock:1" and "election:1", the thin
--          form too (queue_lib); refuses anything else)
-- KEYS[1]: the mutex (mutex_lib) or the meta hash <prefix>:{<name>}
-- KEYS[2]: holders    <prefix>:{<name>}:holders
-- KEYS[3]: queue      <prefix>:{<name>}:queue
-- KEYS[4]: fence key  <prefix>:{<name>}:fence     (keeps the last token issued)
-- ARGV[1]: wake-up channel <prefix>:{<name>}:wake
-- ARGV[2]: lifetime of the fence key in milliseconds
-- Ends every hold and queue place of the name at once (an administrator's last resort): its
-- keys go, except the fence key (tokens keep rising). Waiting clients are told (a mutex's on
-- the channel, a queue's each on its client's channel) and try again; an election's observers
-- are told nobody leads (on the channel, as by a resignation); holders find out at their next
-- renewal and see their guards lost.
-- returns: {layout, holders, waiters}  what was removed (layout '' when nothing was stored):
--                                     holders counts the owners whose leases ran, once each
--          {-1, type, i}              KEYS[i] holds data redlatch did not write (keys_lib)
--          {-2, layout}               the hash is not redlatch's (no or unknown layout tag)
local m, h, q, channel = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
-- The layouts of version 1 this script may remove (a plain mutex's is mutex_lib's).
local QUEUED = {['fair:1'] = true, ['semaphore:1'] = true, ['rwlock:1'] = true,
                ['election:1'] = true}
-- Refuses foreign data under the sorted sets and the fence key (keys_lib).
local function others()
  for j, k in ipairs({h, q}) do
    local bad = foreign(k, j + 1)
    if bad then return bad end
  end
  return (fence_last(KEYS[4], 4, false))
end
local kind = redis.call('TYPE', m)['ok']
if kind == 'none' then return others() or {'', 0, 0} end
if kind == 'string' then
  -- A queued primitive's thin hold (queue_lib): one holder, nobody waiting to tell.
  local one = thin_read(redis.call('GET', m))
  if one then
    -- Of the thin form's shape but another layout (a newer version's, or not ours): refused.
    if not QUEUED[one.layout] then return {-2, one.layout} end
    local bad = others()
    if bad then return bad end
    redis.call('DEL', m)
    return {one.layout, 1, 0}
  end
  local _, bad = mutex_read(m, 1)
  if bad then return bad end
  redis.call('DEL', m)
  redis.call(PUBLISH, channel, '1')
  return {MUTEX, 1, 0}
end
if kind ~= 'hash' then return {-1, kind, 1} end
local meta = redis.call('HMGET', m, '~layout', '~writer', '~wexp', '~lterm', '~lseq')
local layout = meta[1]
if not QUEUED[layout] then
  return {-2, layout or ''}
end
local bad = others()
if bad then return bad end
-- The owners whose holds run (a lease that ran out but was not cleared yet is no holder): the
-- shared holders, and the exclusive holder unless it also holds shared (one owner).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holders = redis.call('ZCOUNT', h, '(' .. now, '(+inf')
local writer = meta[2]
if writer and (tonumber(meta[3]) or 0) > now then
  local shared = tonumber(redis.call('ZSCORE', h, writer))
  if not (shared and shared > now) then holders = holders + 1 end
end
-- Queue members are client/owner/want; `~` marks the set (see queue_lib). Each waiter is
-- asked to look again by `client/owner`, on its client's channel (calls_lib's tell).
local waiters = {}
for _, w in ipairs(redis.call('ZRANGE', q, 0, -1)) do
  local c, o = string.match(w, '^([^/]*)/([^/]+)/')
  if o then waiters[#waiters + 1] = c .. '/' .. o end
end
local fence = redis.call('HGET', m, '~fence')
if fence then fence_raise(KEYS[4], fence, ARGV[2]) end
redis.call('DEL', m, h, q)
if #waiters > 0 then tell(channel, waiters) end
-- An election's observers are told that nobody leads, as by a resignation (elect_proclaim's
-- message, one version on from the record's).
if layout == 'election:1' and meta[4] then
  redis.call(PUBLISH, channel, '=' .. meta[4] .. ':' .. ((tonumber(meta[5]) or 0) + 1))
end
return {layout, holders, #waiters}
