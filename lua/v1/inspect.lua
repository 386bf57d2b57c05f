-- name:    inspect
-- layout:  1 (reads "mutex:2" and the queued layouts ("fair:1", "semaphore:1", "rwlock:1",
--          "election:1"), their thin form too (queue_lib); writes nothing)
-- KEYS[1]: the mutex (mutex_lib) or the meta hash <prefix>:{<name>}
-- KEYS[2]: holders    <prefix>:{<name>}:holders
-- KEYS[3]: queue      <prefix>:{<name>}:queue
-- KEYS[4]: fence key  <prefix>:{<name>}:fence
-- ARGV[1]: none is read (the script takes no arguments)
-- returns: {layout, used, capacity, last fence, holders, waiters} where layout is '' when
--          nothing is stored under the name, holders is a flat list of
--          (owner, exclusive holds, read holds or permits, lease left in ms) and waiters a
--          flat list of (owner, op .. units .. '/' .. lease ms, client id), in queue order.
--          Holders whose lease ran out are left out, and so are the waiters of a client whose
--          hand-over ran out unanswered (the next call removes them: queue_lib's purge).
--          {-1, type, i} when KEYS[i] holds data redlatch did not write (see keys_lib),
--          {-2, layout} for another layout ('' for a hash without a layout tag).
local m, h, q, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local bad, last = fence_last(fence, 4, false)
if bad then return bad end
last = last and string.format('%.0f', last) or '0'

local kind = redis.call('TYPE', m)['ok']
if kind == 'none' then
  for j, k in ipairs({h, q}) do
    bad = foreign(k, j + 1)
    if bad then return bad end
  end
  return {'', 0, 0, last, {}, {}}
end
if kind == 'string' then
  -- A queued primitive's thin hold (queue_lib): one holder, nobody waiting.
  local one = thin_read(redis.call('GET', m))
  if one then
    for j, k in ipairs({h, q}) do
      bad = foreign(k, j + 1)
      if bad then return bad end
    end
    local exclusive = one.op == 'x' or one.op == 'w'
    if one.op ~= 'r' and tonumber(one.token) > tonumber(last) then last = one.token end
    local shared = exclusive and 0 or one.units
    return {one.layout, shared, one.cap, last,
            {one.owner, exclusive and 1 or 0, shared, redis.call('PTTL', m)}, {}}
  end
  local held, bad = mutex_read(m, 1)
  if bad then return bad end
  if tonumber(held.token) > tonumber(last) then last = held.token end
  return {MUTEX, 0, 0, last, {held.owner, held.holds, 0, redis.call('PTTL', m)}, {}}
end
if kind ~= 'hash' then return {-1, kind, 1} end
local layout = redis.call('HGET', m, '~layout')
if not layout then return {-2, ''} end
local holders, waiters = {}, {}

for j, k in ipairs({h, q}) do
  bad = foreign(k, j + 1)
  if bad then return bad end
end
local meta = redis.call('HMGET', m, '~writer', '~wholds', '~wexp', '~used', '~cap', '~fence',
                        '~wclient')
local writer, wexp = meta[1], tonumber(meta[3]) or 0
-- Clients whose hand-over ran out unanswered (still marked with them): gone, with every
-- waiter of theirs, as the next call will find (queue_lib's purge).
local gone = {}
if writer and wexp <= now and meta[7] then gone[meta[7]] = true end
for _, o in ipairs(redis.call('ZRANGE', h, '-inf', now, 'BYSCORE')) do
  local c = string.match(redis.call('HGET', m, 'h:' .. o) or '', '^[^/]*/[^/]*/(.+)$')
  if c then gone[c] = true end
end
if meta[6] then last = meta[6] end
local function shared_holds(o)
  local v = redis.call('HGET', m, 'h:' .. o) or ''
  return tonumber(string.match(v, '^(%d+)')) or 0
end
local shared = {}
local hs = redis.call('ZRANGE', h, '(' .. now, '+inf', 'BYSCORE', 'WITHSCORES')
for j = 1, #hs, 2 do
  if hs[j] ~= '~' then shared[hs[j]] = tonumber(hs[j + 1]) end
end
if writer and wexp > now then
  local n, left = 0, wexp - now
  if shared[writer] then
    n = shared_holds(writer)
    left = math.max(left, shared[writer] - now)
    shared[writer] = nil
  end
  for _, v in ipairs({writer, meta[2], n, left}) do holders[#holders + 1] = v end
end
for j = 1, #hs, 2 do
  local o = hs[j]
  if shared[o] then
    for _, v in ipairs({o, 0, shared_holds(o), shared[o] - now}) do holders[#holders + 1] = v end
  end
end
for _, w in ipairs(redis.call('ZRANGE', q, 0, -1)) do
  local c, o, what = string.match(w, '^([^/]*)/([^/]+)/(%a%d+/%d+)/%d+$')
  if o and not gone[c] then
    for _, v in ipairs({o, what, c}) do waiters[#waiters + 1] = v end
  end
end
return {layout, meta[4] or 0, meta[5] or 0, last, holders, waiters}
