-- name:    queue_lib
-- layout:  1
-- Prepended to every queue_* script (and to nothing else): the state of a fair mutex, a
-- semaphore or a read-write lock, and the FIFO queue of its waiters.
-- KEYS[i..i+2] of one name, as the table s = {m, h, q, i} (f and ttl: the fence key and its
-- lifetime, for scripts that grant):
--   m  meta hash  <prefix>:{<name>}          ~layout, ~cap, ~seq, ~used, ~waiting, ~writer,
--                                           ~wholds, ~wfence, ~wexp (the exclusive holder, its
--                                           hold count, token and lease expiry), ~fence (the
--                                           last token issued), ~next, ~exp, h:<owner> (read
--                                           holds or permits), f:<owner> (a permit's token),
--                                           q:<owner> (a waiter: op .. units .. '/' .. lease
--                                           ms .. '/' .. eviction deadline)
--   h  holders    <prefix>:{<name>}:holders  owner of shared holds (read holds, a permit) ->
--                                           lease expiry
--   q  queue      <prefix>:{<name>}:queue    waiter -> ticket (FIFO order)
-- ARGV[]:  none (the functions take their inputs as parameters)
-- returns: nothing (a library)
-- Ops: x exclusive (fair mutex), r read, w write, s permits, q a waiter's queue entry.
-- Every time is the server's clock (TIME, in ms), never a client's.
--
-- Cost: each call into Redis from a script costs more than most of the work it does, so a
-- script reads the shared meta fields in one HMGET, keeps every meta change in `s` and writes
-- them back in one HSET and one HDEL (`finish`). `~next` is a lower bound of every deadline
-- (leases and waiters' places), so expired entries are looked for only once it has passed;
-- `~exp` is the expiry set on the keys (no deadline is later), so keys are touched only when a
-- deadline goes past it. The fence key is written when the name goes idle; while it is in use,
-- `~fence` holds the last token.

local FIELDS = {'~layout', '~used', '~cap', '~seq', '~waiting', '~writer', '~wholds', '~wfence',
                '~wexp', '~fence', '~next', '~exp'}

-- The server's clock in ms, from a TIME reply.
local function now_ms(t)
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A meta field as this script sees it (its own writes first); false when absent.
local function get(s, f)
  local v = s.set[f]
  if v ~= nil then return v end
  if s.del[f] then return false end
  v = s.v[f]
  if v == nil then
    v = redis.call('HGET', s.m, f)
    s.v[f] = v
  end
  return v
end

local function num(s, f)
  return tonumber(get(s, f)) or 0
end

local function put(s, f, v)
  s.set[f] = v
  s.del[f] = nil
  s.wrote = true
end

local function drop(s, f)
  s.set[f] = nil
  s.del[f] = true
  s.wrote = true
end

-- Reads the meta hash (its shared fields and `extra` fields, in one call) into a new state
-- table for keys {m, h, q} of `layout`. Returns the state, or nil and an error reply when the
-- keys hold foreign data (nothing is written then).
local function open(keys, layout, extra)
  local s = {m = keys[1], h = keys[2], q = keys[3], i = keys.i or 1, layout = layout,
             v = {}, set = {}, del = {}, hrem = {}, fresh = {}, top = 0}
  local names = {unpack(FIELDS)}
  for _, f in ipairs(extra or {}) do names[#names + 1] = f end
  local r = redis.pcall('HMGET', s.m, unpack(names))
  if r.err then return nil, {-1, redis.call('TYPE', s.m)['ok'], s.i} end
  for j, f in ipairs(names) do s.v[f] = r[j] end
  local found = s.v['~layout']
  if found then
    if found ~= layout then return nil, {-2, found} end
    s.exists = true
    s.next = tonumber(s.v['~next']) or 0
    s.exp = tonumber(s.v['~exp']) or 0
    return s
  end
  s.exp = 0
  if redis.call('EXISTS', s.m, s.h, s.q) > 0 then
    local kind = redis.call('TYPE', s.m)['ok']
    if kind == 'hash' then return nil, {-2, ''} end
    if kind ~= 'none' then return nil, {-1, kind, s.i} end
    for j, k in ipairs({s.h, s.q}) do
      local zk = redis.call('TYPE', k)['ok']
      if zk ~= 'none' and zk ~= 'zset' then return nil, {-1, zk, s.i + j} end
    end
    -- Ours, but meaningless without the meta hash that described them.
    redis.call('DEL', s.h, s.q)
  end
  return s
end

-- Notes a deadline (server ms) being written: it may lower `~next` and push the keys' expiry.
local function deadline(s, d)
  if d > s.top then s.top = d end
  if not s.next or d < s.next then
    s.next = d
    put(s, '~next', d)
  end
end

-- What a waiter asks for, from its q: field: op, units, lease ms and its place's deadline.
local function want(w)
  local op, n, lease, d = string.match(w or '', '^(%a)(%d+)/(%d+)/(%d+)$')
  return op or 'x', tonumber(n) or 1, tonumber(lease) or 0, tonumber(d) or 0
end

-- Removes waiters from the queue.
local function leave(s, list)
  if #list == 0 then return end
  redis.call('ZREM', s.q, unpack(list))
  for _, o in ipairs(list) do drop(s, 'q:' .. o) end
  put(s, '~waiting', num(s, '~waiting') - #list)
end

-- Anyone holds the lock (or a permit).
local function held(s)
  return num(s, '~used') > 0 or get(s, '~writer') ~= false
end

-- `o` holds no shared holds any more: its entry in h goes at the end of the script (after any
-- hand-over has added the next holders', so the key is not deleted and made again without its
-- expiry).
local function unlist(s, o)
  s.hrem[o] = true
end

-- Gives up every shared hold of `o` (its read holds, or its permit).
local function unshare(s, o)
  local n = tonumber(get(s, 'h:' .. o))
  if not n then return false end
  drop(s, 'h:' .. o)
  drop(s, 'f:' .. o)
  put(s, '~used', num(s, '~used') - n)
  unlist(s, o)
  return true
end

-- Frees the exclusive hold.
local function unwrite(s)
  drop(s, '~writer')
  drop(s, '~wholds')
  drop(s, '~wfence')
  drop(s, '~wexp')
end

-- Counts `units` more shared holds for `o` and sets its lease expiry in h (never shortening it).
local function share(s, o, units, ends)
  local used = num(s, '~used')
  if used == 0 and next(s.hrem) == nil then s.fresh[s.h] = true end
  put(s, '~used', used + units)
  s.hrem[o] = nil
  redis.call('ZADD', s.h, 'GT', ends, o)
  deadline(s, ends)
end

-- Once `~next` has passed: drops the holders whose lease ran out and the waiters whose place
-- did, and sets `~next` to the earliest deadline left. Returns how many went.
local function purge(s, now)
  if not s.next or now < s.next then return 0 end
  local went, nxt = 0, false
  local function seen(d)
    if not nxt or d < nxt then nxt = d end
  end
  if get(s, '~writer') then
    if num(s, '~wexp') <= now then
      unwrite(s)
      went = 1
    else
      seen(num(s, '~wexp'))
    end
  end
  local gone = redis.call('ZRANGE', s.h, '-inf', now, 'BYSCORE')
  for _, o in ipairs(gone) do unshare(s, o) end
  if #gone > 0 then
    redis.call('ZREM', s.h, unpack(gone))
    for _, o in ipairs(gone) do s.hrem[o] = nil end
  end
  local first = redis.call('ZRANGE', s.h, 0, 0, 'WITHSCORES')
  if first[2] then seen(tonumber(first[2])) end
  local all = redis.call('ZRANGE', s.q, 0, -1)
  local late = {}
  if #all > 0 then
    local fields = {}
    for j, o in ipairs(all) do fields[j] = 'q:' .. o end
    local wants = redis.call('HMGET', s.m, unpack(fields))
    for j, o in ipairs(all) do
      s.v[fields[j]] = wants[j]
      local _, _, _, d = want(wants[j])
      if d <= now then late[#late + 1] = o else seen(d) end
    end
  end
  leave(s, late)
  s.next = nxt
  if nxt then put(s, '~next', nxt) else drop(s, '~next') end
  return went + #gone + #late
end

-- The waiters at the head of the queue that could all be granted now, in queue order: as many
-- as the free permits cover, every reader up to the first writer, or one exclusive waiter.
-- A waiter that does not fit stops the walk, so nobody overtakes it. Each entry is
-- {id, op, units, lease, deadline}. The head is read alone first: for the locks it is all that
-- can go.
local function grantable(s)
  local out = {}
  local writer = get(s, '~writer') ~= false
  local used, cap = num(s, '~used'), num(s, '~cap')
  local from, size = 0, 1
  while true do
    local batch = redis.call('ZRANGE', s.q, from, from + size - 1)
    if #batch == 0 then return out end
    local fields = {}
    for j, o in ipairs(batch) do fields[j] = 'q:' .. o end
    local wants
    if #batch == 1 then
      wants = {get(s, fields[1])}
    else
      wants = redis.call('HMGET', s.m, unpack(fields))
      for j, f in ipairs(fields) do s.v[f] = wants[j] end
    end
    for j, o in ipairs(batch) do
      local op, n, lease, d = want(wants[j])
      if op == 's' then
        if used + n > cap then return out end
        used = used + n
      elseif op == 'r' then
        if writer then return out end
        used = used + 1
      else
        if writer or used > 0 or #out > 0 then return out end
        return {{o, op, n, lease, d}}
      end
      out[#out + 1] = {o, op, n, lease, d}
    end
    if #batch < size then return out end
    from, size = from + size, 16
  end
end

-- A new fencing token: strictly above the last one issued for the name, and never below the
-- server clock in microseconds (`clock` is a TIME reply). nil if the fence key is foreign.
local function mint(s, clock)
  local last = tonumber(get(s, '~fence'))
  if not last then
    local stored = redis.pcall('GET', s.f)
    if type(stored) == 'table' and stored.err then return nil end
    last = tonumber(stored or '0')
    if not last then return nil end
  end
  local token = string.format('%.0f',
    math.max(last + 1, tonumber(clock[1]) * 1000000 + tonumber(clock[2])))
  put(s, '~fence', token)
  return token
end

-- Gives `o` a fresh hold of `op` (units for s) until `ends` (server ms); returns its fencing
-- token (0 for a read hold). The caller has checked that it fits.
local function take(s, o, op, units, ends, token)
  if op == 'r' then
    put(s, 'h:' .. o, num(s, 'h:' .. o) + 1)
    share(s, o, 1, ends)
    return 0
  elseif op == 's' then
    put(s, 'h:' .. o, units)
    put(s, 'f:' .. o, token)
    share(s, o, units, ends)
  else
    put(s, '~writer', o)
    put(s, '~wholds', 1)
    put(s, '~wfence', token)
    put(s, '~wexp', ends)
    deadline(s, ends)
  end
  return token
end

-- Hands the lock over: every waiter that is grantable now gets its hold here, leaves the
-- queue, and is told in one message of space-separated `id:fence:ms` triples on `channel`. The
-- hold's first term (ms) is its lease, cut to what is left of the waiter's place: a waiter
-- that died in the queue holds the lock no longer than it would have held up the queue. A
-- waiter that misses the message finds the hold when it next tries (claim `new`).
local function handoff(s, channel, now, clock)
  local go = grantable(s)
  if #go == 0 then return end
  local told, ids = {}, {}
  for j, g in ipairs(go) do
    local o, op, n, lease, d = g[1], g[2], g[3], g[4], g[5]
    lease = math.max(math.min(lease, d - now), 1)
    local token = 0
    if op ~= 'r' then token = mint(s, clock) or 0 end
    token = take(s, o, op, n, now + lease, token)
    told[j] = o .. ':' .. token .. ':' .. lease
    ids[j] = o
  end
  leave(s, ids)
  redis.call('PUBLISH', channel, table.concat(told, ' '))
end

-- Writes the state back and returns `reply`. Nobody holding or waiting deletes the keys (and
-- keeps the last token in the fence key); otherwise every key lives until the latest deadline,
-- rounded up to the next whole second, so most calls leave the expiry as it is. A call that
-- wrote nothing creates nothing.
local function finish(s, reply)
  if not s.wrote and next(s.hrem) == nil then return reply end
  if not held(s) and num(s, '~waiting') <= 0 then
    local fence = get(s, '~fence')
    if fence then redis.call('SET', s.f, fence, 'PX', s.ttl) end
    redis.call('DEL', s.m, s.h, s.q)
    return reply
  end
  if next(s.hrem) ~= nil then
    local list = {}
    for o in pairs(s.hrem) do list[#list + 1] = o end
    redis.call('ZREM', s.h, unpack(list))
  end
  if not s.exists then
    put(s, '~layout', s.layout)
    put(s, '~cap', s.cap or 0)
    put(s, '~used', num(s, '~used'))
    put(s, '~waiting', num(s, '~waiting'))
  end
  local keys, at = s.fresh, s.exp
  if s.top > s.exp then
    at = (math.floor(s.top / 1000) + 1) * 1000
    put(s, '~exp', at)
    keys = {[s.m] = true, [s.h] = num(s, '~used') > 0, [s.q] = num(s, '~waiting') > 0}
  end
  local fields = {}
  for f, v in pairs(s.set) do
    fields[#fields + 1] = f
    fields[#fields + 1] = v
  end
  if #fields > 0 then redis.call('HSET', s.m, unpack(fields)) end
  local gone = {}
  for f in pairs(s.del) do
    if s.v[f] ~= false then gone[#gone + 1] = f end
  end
  if #gone > 0 then redis.call('HDEL', s.m, unpack(gone)) end
  if at > 0 then
    for k, on in pairs(keys) do
      if on then redis.call('PEXPIREAT', k, at) end
    end
  end
  return reply
end

-- ==== end of queue_lib ====
