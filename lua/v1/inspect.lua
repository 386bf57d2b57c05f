-- name:    inspect
-- layout:  1 (reads "mutex:1", "fair:1", "semaphore:1" and "rwlock:1"; writes nothing)
-- KEYS[1]: lock or meta hash <prefix>:{<name>}
-- KEYS[2]: holders    <prefix>:{<name>}:holders
-- KEYS[3]: queue      <prefix>:{<name>}:queue
-- KEYS[4]: timeouts   <prefix>:{<name>}:timeouts
-- KEYS[5]: fence key  <prefix>:{<name>}:fence
-- ARGV[1]: none is read (the script takes no arguments)
-- returns: {layout, used, capacity, last fence, holders, waiters} where layout is '' when
--          nothing is stored under the name, holders is a flat list of
--          (owner, exclusive holds, read holds or permits, lease left in ms) and waiters a
--          flat list of (owner, op .. units, ms left before eviction), in queue order.
--          Holders and waiters whose time ran out are left out. {-1, type, i} for foreign data.
local m, h, q, t, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local last = '0'
local fkind = redis.call('TYPE', fence)['ok']
if fkind == 'string' then last = redis.call('GET', fence)
elseif fkind ~= 'none' then return {-1, fkind, 5} end

local kind = redis.call('TYPE', m)['ok']
if kind == 'none' then return {'', 0, 0, last, {}, {}} end
if kind ~= 'hash' then return {-1, kind, 1} end
local layout = redis.call('HGET', m, '~layout') or ''
local holders, waiters = {}, {}

if layout == 'mutex:1' then
  local pttl = redis.call('PTTL', m)
  local fields = redis.call('HGETALL', m)
  for j = 1, #fields, 2 do
    if string.sub(fields[j], 1, 1) ~= '~' then
      for _, v in ipairs({fields[j], fields[j + 1], 0, pttl}) do holders[#holders + 1] = v end
    end
  end
  return {layout, 0, 0, last, holders, waiters}
end

for j, k in ipairs({h, q, t}) do
  local zk = redis.call('TYPE', k)['ok']
  if zk ~= 'none' and zk ~= 'zset' then return {-1, zk, j + 1} end
end
local writer = redis.call('HGET', m, '~writer')
local hs = redis.call('ZRANGE', h, '(' .. now, '+inf', 'BYSCORE', 'WITHSCORES')
for j = 1, #hs, 2 do
  local o = hs[j]
  local x = 0
  if o == writer then x = redis.call('HGET', m, '~wholds') end
  local n = redis.call('HGET', m, 'h:' .. o) or 0
  for _, v in ipairs({o, x, n, tonumber(hs[j + 1]) - now}) do holders[#holders + 1] = v end
end
for _, o in ipairs(redis.call('ZRANGE', q, 0, -1)) do
  local d = tonumber(redis.call('ZSCORE', t, o))
  if d and d > now then
    for _, v in ipairs({o, redis.call('HGET', m, 'q:' .. o) or '', d - now}) do
      waiters[#waiters + 1] = v
    end
  end
end
local used = redis.call('HGET', m, '~used') or 0
return {layout, used, redis.call('HGET', m, '~cap') or 0, last, holders, waiters}
