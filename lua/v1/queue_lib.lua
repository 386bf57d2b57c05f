-- name:    queue_lib
-- layout:  1
-- Prepended to every queue_* script (and to nothing else): the state of a fair mutex, a
-- semaphore or a read-write lock, and the FIFO queue of its waiters.
-- KEYS[i..i+3] of one name, as the table s = {m, h, q, f, i} (f: the fence key, given to the
-- scripts that may grant; ttl, set by them: its lifetime):
--   m  meta hash  <prefix>:{<name>}          ~layout, ~cap, ~seq (last ticket), ~used (read
--                                           holds or permits held), ~fence (the last token
--                                           issued, when newer than the fence key's: keys_lib),
--                                           ~next, ~exp; the exclusive holder:
--                                           ~writer, ~wholds, ~wfence, ~wexp (its lease's
--                                           end), ~wclient; a shared holder (read holds or a
--                                           permit): h:<owner> = holds/fence/client
--   h  holders    <prefix>:{<name>}:holders  shared holder -> the end of its lease
--   q  queue      <prefix>:{<name>}:queue    waiter -> ticket (FIFO order); a waiter is
--                                           client/owner/<op><units>/<lease ms>/<grace ms>
-- Both sorted sets keep a member `~` at score +inf while they exist, so a ZADD tells from its
-- reply whether it made the key (which then needs the name's expiry).
-- ARGV[]:  none (the functions take their inputs as parameters)
-- returns: nothing (a library)
-- Ops: x exclusive (fair mutex), r read, w write, s permits.
-- Every time is the server's clock (TIME, in ms), never a client's.
--
-- Cost: every call a script makes into Redis costs about as much as the work it does, and the
-- meta hash is read and written whole, so it holds only what every call needs: a waiter lives
-- in its queue member alone, and a contended hand-over of the fair mutex is five calls. A
-- script reads the meta fields in one HMGET, keeps its changes in `s` and writes them back in
-- one HSET and one HDEL (`finish`). `~next` is a lower bound of every holder's lease end, so
-- expired holders are looked for only once it has passed; `~exp` is the expiry set on the
-- keys (no lease ends later), so keys are touched only when a lease goes past it.
--
-- Waiters have no deadline of their own. A hand-over gives the head of the queue a first term
-- of `grace` ms, and marks the hold with the waiter's client (`~wclient`, or the client part of
-- `h:<owner>`) until the waiter answers: its first renewal, or its own next attempt, clears the
-- mark. A hand-over that runs out still marked shows a client that is gone, and every queued
-- waiter of that client goes with it, so a crashed process holds up the queue for one grace at
-- most, however many waiters it had.

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

-- The thin form. A fresh acquisition of an idle name made in plain commands by the client
-- (`SET <meta key> <string> NX PX <lease>`, and for a token `ZADD fence XX GT CH`: see
-- src/protocol/queue.rs, `Take`) leaves one string under the meta key, keys_lib's thin_read:
-- the hold of one owner, nobody else holding or waiting, its lease the key's TTL. It is
-- released by a compare-and-delete (queue_release_thin) and renewed by PEXPIRE
-- (queue_extend). Anything else that meets it (a second owner, a re-entry, a waiter's retry)
-- first turns it into the state it stands for (`inflate`), which every other function reads.

-- Turns the thin hold `one` under the meta key into the state it stands for: the exclusive
-- holder's fields, or a shared holder in the holders set, with its lease's end from the key's
-- TTL (the fence key holds its token, so no `~fence`). The other keys must be absent or ours,
-- and the fence key ours; if not, nothing changes (a hold of `mine`, the caller's fresh owner,
-- is given back) and the error reply is returned.
local function inflate(s, one, mine)
  local bad
  for j, k in ipairs({s.h, s.q}) do
    bad = bad or foreign(k, s.i + j)
  end
  if not bad and s.f then bad = fence_last(s.f, s.i + 3, true) end
  if bad then
    if one.owner == mine then redis.call('DEL', s.m) end
    return bad
  end
  local ends = now_ms(redis.call('TIME')) + math.max(redis.call('PTTL', s.m), 1)
  local at = queue_expiry(ends)
  -- A sorted set left without the meta hash that described it means nothing.
  redis.call('DEL', s.m, s.h, s.q)
  if one.op == 'x' or one.op == 'w' then
    redis.call('HSET', s.m, '~layout', one.layout, '~cap', one.cap, '~next', ends, '~exp', at,
               '~used', 0, '~writer', one.owner, '~wholds', 1, '~wfence', one.token,
               '~wexp', ends)
  else
    local fence = one.op == 'r' and '' or one.token
    redis.call('ZADD', s.h, ends, one.owner, '+inf', '~')
    redis.call('PEXPIREAT', s.h, at)
    redis.call('HSET', s.m, '~layout', one.layout, '~cap', one.cap, '~next', ends, '~exp', at,
               '~used', one.units, 'h:' .. one.owner, one.units .. '/' .. fence .. '/')
  end
  redis.call('PEXPIREAT', s.m, at)
end

-- Reads the meta fields a script needs (`names`, which include ~layout, ~next and ~exp; any
-- other field is read when first asked for) into a new state table for keys {m, h, q[, f]} of
-- `layout`, in one call; a thin hold is turned into its state first (a hold of `mine`, the
-- caller's fresh owner, given back if it cannot be). Returns the state, or nil and an error
-- reply when the keys hold foreign data (nothing is written then).
local function open(keys, layout, names, mine)
  local s = {m = keys[1], h = keys[2], q = keys[3], f = keys[4], i = keys.i or 1,
             layout = layout, v = {}, set = {}, del = {}, hrem = {}, fresh = {}, top = 0}
  local r = redis.pcall('HMGET', s.m, unpack(names))
  if r.err then
    local kind = redis.call('TYPE', s.m)['ok']
    local v = kind == 'string' and redis.call('GET', s.m)
    local one = v and thin_read(v)
    if not one then
      -- A plain mutex holds the name (mutex_lib): another layout, not foreign data.
      local mutex = v and string.match(v, '^(mutex:%d+) ')
      if mutex then return nil, {-2, mutex} end
      return nil, {-1, kind, s.i}
    end
    if one.layout ~= layout then return nil, {-2, one.layout} end
    local bad = inflate(s, one, mine)
    if bad then return nil, bad end
    r = redis.call('HMGET', s.m, unpack(names))
  end
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
  -- No meta hash describes the name: whatever else is under its keys must be ours to be used
  -- (keys_lib), and anything else is refused, untouched.
  if redis.call('EXISTS', s.m, s.h, s.q) > 0 then
    local kind = redis.call('TYPE', s.m)['ok']
    if kind == 'hash' then return nil, {-2, ''} end
    if kind ~= 'none' then return nil, {-1, kind, s.i} end
    for j, k in ipairs({s.h, s.q}) do
      local bad = foreign(k, s.i + j)
      if bad then return nil, bad end
    end
    -- Ours, but meaningless without the meta hash that described them.
    redis.call('DEL', s.h, s.q)
  end
  if s.f then
    -- The last token issued while the name was idle, read here once for `mint`.
    local bad, last = fence_last(s.f, s.i + 3, true)
    if bad then return nil, bad end
    s.v['~fence'] = last and string.format('%.0f', last)
    s.unfenced = not last
  end
  s.empty = true
  return s
end

-- Notes a lease end (server ms) being written: it may lower `~next` and push the keys' expiry.
-- Lowering `~next` means a change may come sooner than queued waiters were told: `finish`
-- tells them.
local function deadline(s, d)
  if d > s.top then s.top = d end
  if not s.next or d < s.next then
    if s.next then s.sooner = true end
    s.next = d
    put(s, '~next', d)
  end
end

-- A waiter's queue member: client/owner/<op><units>/<lease>/<grace>.
local function member(client, owner, op, units, lease, grace)
  return client .. '/' .. owner .. '/' .. op .. units .. '/' .. lease .. '/' .. grace
end

-- A queue member, read back.
local function waiter(m)
  local c, o, op, n, lease, grace = string.match(m, '^([^/]*)/([^/]+)/(%a)(%d+)/(%d+)/(%d+)$')
  return {client = c or '', owner = o or m, op = op or 'x', n = tonumber(n) or 1,
          lease = tonumber(lease) or 0, grace = tonumber(grace) or 0}
end

-- The shared holds of `o`: count, fencing token and client; nil if it has none.
local function shares(s, o)
  local v = get(s, 'h:' .. o)
  if not v then return nil end
  local n, f, c = string.match(v, '^(%d+)/(%d*)/(.*)$')
  return tonumber(n) or 0, f or '', c or ''
end

-- Anyone holds the lock (or a permit).
local function held(s)
  return num(s, '~used') > 0 or get(s, '~writer') ~= false
end

-- `o` holds no shared holds any more: its entry in h goes at the end of the script (after any
-- hand-over has added the next holders', so the key is not deleted and made again).
local function unlist(s, o)
  s.hrem[o] = true
end

-- Gives up every shared hold of `o` (its read holds, or its permit); returns its client, or
-- nil if it held none.
local function unshare(s, o)
  local n, _, c = shares(s, o)
  if not n then return nil end
  drop(s, 'h:' .. o)
  put(s, '~used', num(s, '~used') - n)
  unlist(s, o)
  return c
end

-- Frees the exclusive hold.
local function unwrite(s)
  for _, f in ipairs({'~writer', '~wholds', '~wfence', '~wexp', '~wclient'}) do drop(s, f) end
end

-- Counts `units` more shared holds for `o` (with `fence`; marked with `client` when handed
-- over, else keeping its mark) and sets its lease's end in h (never shortening it).
local function share(s, o, units, ends, fence, client)
  local n, _, c = shares(s, o)
  put(s, 'h:' .. o, ((n or 0) + units) .. '/' .. fence .. '/' .. (client or c or ''))
  put(s, '~used', num(s, '~used') + units)
  s.hrem[o] = nil
  if redis.call('ZADD', s.h, 'GT', ends, o, '+inf', '~') == 2 then s.fresh[s.h] = true end
  deadline(s, ends)
end

-- Once `~next` has passed: drops the holders whose lease ran out, and the queued waiters of the
-- clients whose hand-overs ran out unanswered (see above), and sets `~next` to the earliest
-- lease end left. Returns how many went.
local function purge(s, now)
  if not s.next or now < s.next then return 0 end
  local went, nxt, gone_clients = 0, false, {}
  if get(s, '~writer') then
    local ends = num(s, '~wexp')
    if ends <= now then
      gone_clients[get(s, '~wclient') or ''] = true
      unwrite(s)
      went = 1
    else
      nxt = ends
    end
  end
  local gone = redis.call('ZRANGE', s.h, '-inf', now, 'BYSCORE')
  for _, o in ipairs(gone) do gone_clients[unshare(s, o) or ''] = true end
  if #gone > 0 then
    call_all('ZREM', s.h, gone)
    for _, o in ipairs(gone) do s.hrem[o] = nil end
    went = went + #gone
  end
  local first = redis.call('ZRANGE', s.h, 0, 0, 'WITHSCORES')
  if first[2] and first[1] ~= '~' and (not nxt or tonumber(first[2]) < nxt) then
    nxt = tonumber(first[2])
  end
  gone_clients[''] = nil
  if next(gone_clients) then
    local late = {}
    for _, m in ipairs(redis.call('ZRANGE', s.q, 0, -1)) do
      if m ~= '~' and gone_clients[waiter(m).client] then late[#late + 1] = m end
    end
    if #late > 0 then
      call_all('ZREM', s.q, late)
      went = went + #late
    end
  end
  s.next = nxt
  if nxt then put(s, '~next', nxt) else drop(s, '~next') end
  return went
end

-- `o` asked again and found its hold (a hand-over whose message it missed, or an attempt whose
-- answer was lost): its client is alive (the hand-over's mark goes), and the hold's lease runs
-- until `ends` at least, since the asker counts its lease from this call.
local function answered(s, o, ends)
  if get(s, '~writer') == o then
    if get(s, '~wclient') then drop(s, '~wclient') end
    if num(s, '~wexp') < ends then
      put(s, '~wexp', ends)
      deadline(s, ends)
    end
  end
  local n, f, c = shares(s, o)
  if n then
    if c ~= '' then put(s, 'h:' .. o, n .. '/' .. f .. '/') end
    -- With `~`, as every holders key: one made here takes the name's expiry.
    if redis.call('ZADD', s.h, 'GT', ends, o, '+inf', '~') == 2 then s.fresh[s.h] = true end
    deadline(s, ends)
  end
end

-- Whether anything more could be granted now: no exclusive holder, and a free permit for a
-- semaphore.
local function room(s)
  if get(s, '~writer') then return false end
  local cap = num(s, '~cap')
  return cap == 0 or num(s, '~used') < cap
end

-- Whether waiter `w` could be granted now.
local function fits(s, w)
  if w.op == 's' then return num(s, '~used') + w.n <= num(s, '~cap') end
  if w.op == 'r' then return not get(s, '~writer') end
  return not get(s, '~writer') and num(s, '~used') == 0
end

-- A new fencing token: strictly above the last one issued for the name, and never below the
-- server clock in microseconds (`clock` is a TIME reply). A name without a fence key (its first
-- token, or its counter expired or was lost in a failover) starts a second ahead of the clock,
-- above any token a client issued from its estimate of the clock. The fence key is raised to it
-- at once: `~fence` goes with the meta hash when the keys expire (a holder that let its lease
-- run out), and the next token is then minted from the fence key. nil if the fence key is
-- foreign.
local function mint(s, clock)
  local us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  local last = tonumber(get(s, '~fence'))
  if not last and not s.unfenced then
    local bad
    bad, last = fence_last(s.f, s.i + 3, true)
    if bad then return nil end
    s.unfenced = not last
  end
  local token = string.format('%d', last and math.max(last + 1, us) or us + 1000000)
  put(s, '~fence', token)
  fence_raise(s.f, token, s.ttl)
  return token
end

-- A new place's ticket: above the last one given for the name, and never below the server
-- clock in microseconds, so a ticket is never given twice, even after the keys were deleted
-- (the order of the queue, and what a hand-over message names). `~seq` must be among the
-- fields the script opened.
local function ticket(s, clock)
  local t = string.format('%d',
    math.max(num(s, '~seq') + 1, tonumber(clock[1]) * 1000000 + tonumber(clock[2])))
  put(s, '~seq', t)
  return t
end

-- Gives `o` a fresh hold of `op` (units for s) until `ends` (server ms), marked with `client`
-- for a hand-over ('' otherwise); returns its fencing token (0 for a read hold). The caller has
-- checked that it fits.
local function take(s, o, op, units, ends, token, client)
  if op == 'r' then
    share(s, o, 1, ends, '', client)
    return 0
  elseif op == 's' then
    share(s, o, units, ends, token, client)
  else
    put(s, '~writer', o)
    put(s, '~wholds', 1)
    put(s, '~wfence', token)
    put(s, '~wexp', ends)
    if client ~= '' then put(s, '~wclient', client) elseif get(s, '~wclient') then
      drop(s, '~wclient')
    end
    deadline(s, ends)
  end
  return token
end

-- Hands the lock over: the waiters at the head of the queue that fit now (as many as the free
-- permits cover, every reader up to the first writer, or one exclusive waiter) get their hold
-- here, leave the queue, and are told in space-separated `client/owner:fence:ms:ticket`
-- entries, one message per client on that client's own channel `<channel>:<client>`
-- (calls_lib's tell; the client part also keeps apart waits of one owner token in two
-- processes). The first waiter that does not fit stops it, so nobody
-- overtakes. The hold's first term (ms) is its lease, cut to the waiter's grace: a waiter that
-- died in the queue holds the lock no longer than that. The ticket names the place handed
-- over: a waiter that has since been dropped and queued again (a late message) tells the
-- message is not about its place. A waiter that misses the message finds the hold when it
-- next tries (claim `new` or `queued`).
local function handoff(s, channel, now, clock)
  local told = {}
  while room(s) do
    local head = redis.call('ZPOPMIN', s.q)
    local m = head[1]
    if not m or m == '~' then
      -- Nobody waits: the queue key is gone now, and made again (with its expiry) by the
      -- next waiter.
      s.qempty = true
      break
    end
    local w = waiter(m)
    if not fits(s, w) then
      redis.call('ZADD', s.q, head[2], m)
      break
    end
    local term = math.max(math.min(w.lease, w.grace), 1)
    local token = 0
    if w.op ~= 'r' then token = mint(s, clock) or 0 end
    token = take(s, w.owner, w.op, w.n, now + term, token, w.client)
    told[#told + 1] = w.client .. '/' .. w.owner .. ':' .. token .. ':' .. term .. ':' .. head[2]
    if w.op ~= 'r' and w.op ~= 's' then break end
  end
  if #told > 0 then tell(channel, told) end
end

-- A lease that ends sooner than `~next` said (a short grace or fixed lease) may run out
-- before any queued waiter looks again. Tells the first waiter of each client in the queue,
-- by `client/owner` alone: it asks again and learns when to look. One per client is enough: a
-- client's waiters live and die together.
local function tell_sooner(s)
  local told, seen = {}, {}
  for _, m in ipairs(redis.call('ZRANGE', s.q, 0, -1)) do
    if m ~= '~' then
      local w = waiter(m)
      if not seen[w.client] then
        seen[w.client] = true
        told[#told + 1] = w.client .. '/' .. w.owner
      end
    end
  end
  if #told > 0 then tell(s.channel, told) end
end

-- Writes the state back and returns `reply`. Nobody holding or waiting deletes the keys (and
-- keeps the last token in the fence key); otherwise every key lives until a little after the
-- latest lease end, rounded up to the next whole second (keys_lib's queue_expiry), so most
-- calls leave the expiry as it is. A pushed expiry
-- goes onto every key of the name, the holders key too while it holds only `~` (the shared
-- holders it gets later must not go before their leases). A call that wrote nothing creates
-- nothing.
local function finish(s, reply)
  if not s.wrote and next(s.hrem) == nil then return reply end
  if s.sooner and s.channel and not s.qempty then tell_sooner(s) end
  if not held(s) and (s.qempty or redis.call('ZCARD', s.q) <= 1) then
    local fence = get(s, '~fence')
    if fence then fence_raise(s.f, fence, s.ttl) end
    redis.call('DEL', s.m, s.h, s.q)
    s.idle = true
    return reply
  end
  if next(s.hrem) ~= nil then
    local list = {}
    for o in pairs(s.hrem) do list[#list + 1] = o end
    call_all('ZREM', s.h, list)
  end
  if not s.exists then
    put(s, '~layout', s.layout)
    put(s, '~cap', s.cap or 0)
    put(s, '~used', num(s, '~used'))
  end
  local keys, at = s.fresh, s.exp
  if s.top > 0 and queue_expiry(s.top) > s.exp then
    at = queue_expiry(s.top)
    put(s, '~exp', at)
    keys = {[s.m] = true, [s.h] = true, [s.q] = true}
  end
  local fields = {}
  for f, v in pairs(s.set) do
    fields[#fields + 1] = f
    fields[#fields + 1] = v
  end
  if #fields > 0 then call_all('HSET', s.m, fields) end
  local gone = {}
  for f in pairs(s.del) do
    if s.v[f] ~= false then gone[#gone + 1] = f end
  end
  if #gone > 0 then call_all('HDEL', s.m, gone) end
  if at > 0 then
    for k, on in pairs(keys) do
      if on then redis.call('PEXPIREAT', k, at) end
    end
  end
  return reply
end

-- ==== end of queue_lib ====
