-- name:    queue_release_fast
-- layout:  1 (see queue_acquire)
-- Runs in queue_release after calls_lib and keys_lib, before queue_lib is loaded, for the
-- releases that are common and simple, before any lease ran out (`~next` not passed): an
-- owner's last hold (the exclusive holder's, a reader's only read hold, or a permit holder's
-- units) is released as queue_lib's handoff and finish would, in about a third of the general
-- path's server time (HMGET, TIME, ZPOPMIN of the queue's head, and then):
-- * nobody waits and nobody else holds: the name goes idle and the keys go (DEL; a ZADD of the
--   fence key too when a hand-over issued a token since the name was last idle);
-- * nobody waits, or the head waits for more than is free now, while other shared holders
--   stay: this holder's share goes (ZREM, HSET of `~used`, HDEL; the head put back);
-- * the head is handed the hold, and nobody behind it could go: an exclusive waiter once
--   nothing is held (after the exclusive holder, or the last reader), or a permit waiter whose
--   units fill the semaphore (ZADD, ZREM of the holders for a shared hold, HSET, HDEL,
--   PUBLISH, a ZADD GT of the fence key with the token issued; a ZSCORE of the fence key for the
--   first token a hand-over issues since the name was idle, a PEXPIREAT of the keys when the
--   new lease ends past `~exp`).
-- * several waiters from the head go: the readers after the exclusive holder's last hold,
--   every one up to the first other waiter or the queue's end; the permit waiters while the
--   permits freed cover them, up to the first they do not (a ZPOPMIN each, the waiter that
--   stopped them put back; HMGET, ZADD of the holders, HSET, HDEL, PUBLISH; for permits ZREM
--   of the releaser, a ZSCORE of the fence key as above and its ZADD GT; a PEXPIREAT of the
--   keys when a lease ends past `~exp`).
-- Anything else (a term that ends before `~next`, a waiter that already holds, an owner queued
-- twice) falls through to the general path, which sees the name exactly as it was (every
-- waiter popped and not handed the hold is put back first).
-- KEYS[], ARGV[] and replies: those of queue_release.
do
  local op, owner = ARGV[2], ARGV[3]
  -- The last token issued for the name (`~fence` of the state `m` read, else the fence key's,
  -- keys_lib), as the next one is minted from: a name without a fence key starts a second ahead
  -- of the clock `us` (queue_lib's mint). nil for a fence key that is not ours, which the
  -- general path refuses.
  local function last_token(m, us)
    local fence = tonumber(m[6])
    if fence then return fence end
    local bad, last = fence_last(KEYS[4], 4, true)
    if bad then return nil end
    return last or us + 999999
  end
  -- The keys live past the latest lease end (keys_lib's queue_expiry): when that puts their
  -- expiry past `~exp` (m[8]), the new expiry goes into `fields` and onto every key (the
  -- holders key too when it holds only `~`: shared holders it gets later must not go before
  -- their leases). Returns whether it did.
  local function expire(m, top, fields)
    local at = queue_expiry(top)
    if top <= 0 or at <= (tonumber(m[8]) or 0) then return false end
    fields[#fields + 1], fields[#fields + 2] = '~exp', at
    redis.call('PEXPIREAT', KEYS[1], at)
    redis.call('PEXPIREAT', KEYS[2], at)
    redis.call('PEXPIREAT', KEYS[3], at)
    return true
  end
  -- This owner's shared hold leaves the holders and the state.
  local function unshare()
    redis.call('ZREM', KEYS[2], owner)
    redis.call('HDEL', KEYS[1], 'h:' .. owner)
  end
  local excl = op == 'x' or op == 'w'
  if excl or op == 's' or op == 'r' then
    local m = redis.pcall('HMGET', KEYS[1], '~layout', '~next', '~used', '~writer', '~wholds',
                          '~fence', 'h:' .. owner, '~exp', '~cap')
    if type(m) == 'table' and not m.err and m[1] == ARGV[1] then
      local used = tonumber(m[3]) or 0
      -- The shared holds others keep once this release is done; nil: not this path's release.
      local left
      if excl then
        if m[4] == owner and m[5] == '1' and used == 0 and not m[7] then left = 0 end
      elseif not m[4] then
        local n = tonumber(string.match(m[7] or '', '^(%d+)/'))
        if n and n <= used and (op == 's' or n == 1) then left = used - n end
      end
      local clock = left and redis.call('TIME')
      local now = clock and tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
      -- Before `~next`, no lease has ended (it is a lower bound of every lease end).
      local nxt = tonumber(m[2]) or 0
      if clock and now < nxt then
        local head = redis.call('ZPOPMIN', KEYS[3])
        local w = head[1]
        -- A waiter: client/owner/<op><units>/<lease>/<grace> (see queue_lib's member).
        local c, o, wop, units, lease, grace
        if w and w ~= '~' then
          c, o, wop, units, lease, grace =
            string.match(w, '^([^/]*)/([^/]+)/(%a)(%d+)/(%d+)/(%d+)$')
        end
        -- What the head gets: 'one', the hold (and nobody behind it could go); 'none', nothing
        -- (it waits for more than is free); nil, not this path's case.
        local goes
        if not w or w == '~' then
          goes = 'none'
        elseif c ~= nil and c ~= '' then
          if (wop == 'x' or wop == 'w') and op ~= 's' then
            goes = left == 0 and 'one' or 'none'
          elseif wop == 'r' and op == 'w' then
            goes = 'several'
          elseif wop == 's' and op == 's' then
            local fill = left + tonumber(units) - (tonumber(m[9]) or 0)
            if fill > 0 then
              goes = 'none'
            elseif fill == 0 then
              goes = 'one'
            else
              goes = 'several'
            end
          end
        end
        local term = c and math.max(math.min(tonumber(lease), tonumber(grace)), 1)
        -- A hold that ends before `~next` would have to tell the queue (the general path).
        if (goes == 'one' or goes == 'several') and now + term < nxt then goes = nil end
        local waiting = w and w ~= '~'
        if goes == 'none' and not waiting and left == 0 then
          -- Nobody waits, nobody holds (a queue key holding only `~` is gone now, as the DEL
          -- would make it).
          if m[6] then fence_raise(KEYS[4], m[6], ARGV[5]) end
          redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
          return {2, 1}
        elseif goes == 'none' and left > 0 then
          if waiting then redis.call('ZADD', KEYS[3], head[2], w) end
          redis.call('HSET', KEYS[1], '~used', left)
          unshare()
          return {2}
        elseif goes == 'one' then
          local us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
          local fence = last_token(m, us)
          local ends = now + term
          -- A permit waiter that holds already is not this path's (ZADD NX changes nothing).
          if fence and (wop ~= 's' or redis.call('ZADD', KEYS[2], 'NX', ends, o) == 1) then
            local token = string.format('%d', math.max(fence + 1, us))
            -- The fence key holds it at once (queue_lib's mint).
            fence_raise(KEYS[4], token, ARGV[5])
            local fields
            if wop == 's' then
              fields = {'h:' .. o, units .. '/' .. token .. '/' .. c, '~used', left + units,
                        '~fence', token}
            else
              fields = {'~writer', o, '~wholds', 1, '~wfence', token, '~wexp', ends,
                        '~wclient', c, '~fence', token}
              if not excl then fields[#fields + 1] = '~used'; fields[#fields + 1] = 0 end
            end
            expire(m, ends, fields)
            redis.call('HSET', KEYS[1], unpack(fields))
            if not excl then unshare() end
            tell(ARGV[4], {c .. '/' .. o .. ':' .. token .. ':' .. term .. ':' .. head[2]})
            return {2}
          end
        elseif goes == 'several' then
          -- Every waiter from the head that fits, as the general path's handoff lets them in:
          -- readers up to the first writer, permit waiters while the free permits cover them.
          -- The first that does not fit stops them (`stop`, put back); so does the queue's end
          -- (its `~` popped: the key is gone, as the general path leaves it).
          local permits, cap = wop == 's', tonumber(m[9]) or 0
          local used = left + tonumber(units)
          local going, popped, seen, stop = {{o, c, term, head[2], units}}, {}, {[o] = true}, nil
          while goes and (not permits or used < cap) do
            local next_ = redis.call('ZPOPMIN', KEYS[3])
            local n = next_[1]
            if not n then break end
            popped[#popped + 1] = next_
            if n == '~' then break end
            local c2, o2, op2, n2, lease2, grace2 =
              string.match(n, '^([^/]*)/([^/]+)/(%a)(%d+)/(%d+)/(%d+)$')
            if op2 ~= wop or (permits and used + tonumber(n2) > cap) then
              stop = next_
              break
            end
            local t2 = math.max(math.min(tonumber(lease2), tonumber(grace2)), 1)
            -- Told of a sooner change, or an owner queued twice: the general path's.
            if c2 == '' or seen[o2] or now + t2 < nxt then goes = nil end
            seen[o2] = true
            used = used + tonumber(n2)
            going[#going + 1] = {o2, c2, t2, next_[2], n2}
          end
          local names = {}
          for i, g in ipairs(going) do names[i] = 'h:' .. g[1] end
          -- A waiter that holds already (the releaser among them): the general path's.
          if goes then
            for _, v in ipairs(call_all('HMGET', KEYS[1], names)) do
              if v then goes = nil end
            end
          end
          -- Permits' tokens: each above the last one issued, as the general path mints them.
          local us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
          local fence = goes and permits and last_token(m, us)
          if permits and not fence then goes = nil end
          if goes then
            if stop then redis.call('ZADD', KEYS[3], stop[2], stop[1]) end
            local fields, holders, told, top = {'~used', used}, {}, {}, 0
            for i, g in ipairs(going) do
              local ends, token = now + g[3], '0'
              if ends > top then top = ends end
              if permits then
                fence = math.max(fence + 1, us)
                token = string.format('%d', fence)
                fields[#fields + 1] = names[i]
                fields[#fields + 1] = g[5] .. '/' .. token .. '/' .. g[2]
              else
                fields[#fields + 1], fields[#fields + 2] = names[i], '1//' .. g[2]
              end
              holders[#holders + 1], holders[#holders + 2] = ends, g[1]
              told[#told + 1] = g[2] .. '/' .. g[1] .. ':' .. token .. ':' .. g[3] .. ':' .. g[4]
            end
            if permits then
              local last = string.format('%d', fence)
              fields[#fields + 1], fields[#fields + 2] = '~fence', last
              fence_raise(KEYS[4], last, ARGV[5])
            end
            holders[#holders + 1], holders[#holders + 2] = '+inf', '~'
            -- The holders' key made here (its `~` new) takes the name's expiry.
            local made = call_all('ZADD', KEYS[2], holders, 'GT') > #going
            local exp = tonumber(m[8]) or 0
            if not expire(m, top, fields) and made and exp > 0 then
              redis.call('PEXPIREAT', KEYS[2], exp)
            end
            call_all('HSET', KEYS[1], fields)
            if permits then
              unshare()
            else
              redis.call('HDEL', KEYS[1], '~writer', '~wholds', '~wfence', '~wexp', '~wclient')
            end
            tell(ARGV[4], told)
            return {2}
          end
          for _, p in ipairs(popped) do redis.call('ZADD', KEYS[3], p[2], p[1]) end
        end
        -- Passed on to the general path (nothing held and a head that waits for more than
        -- there is, or not this path's case): the head goes back first.
        if waiting then redis.call('ZADD', KEYS[3], head[2], w) end
      end
    end
  end
end
