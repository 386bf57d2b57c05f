-- name:    queue_acquire_fast
-- layout:  1 (see queue_acquire)
-- Runs in queue_acquire after calls_lib and keys_lib, before queue_lib is loaded:
-- * the acquire of an idle name (no meta hash, no holders, no queue: nobody holds or waits),
--   which writes the state queue_lib would write, in five calls (EXISTS, TIME, ZADD XX GT CH of
--   the fence key, or ZSCORE for a read hold, HSET, PEXPIREAT; and ZADD, PEXPIREAT of the
--   holders for a shared hold);
-- * a fresh owner (claim `new`) that may queue (ARGV[7] > 0), holds nothing, and finds the
--   name held against it (an exclusive want and any holder; a read and a writer; permits more
--   than are free) before any lease ran out (`~next` not passed): it takes its place at the
--   end of the queue as queue_acquire would (or keeps the one an earlier attempt whose answer
--   was lost took), in five calls (EXISTS, HMGET, TIME, ZADD NX, HSET of `~seq`; a PEXPIREAT of
--   a queue key it makes);
-- * a fresh owner that holds nothing joins the shared holders (a reader with no writer holding,
--   permits that fit) while nobody waits and no lease ran out, as queue_acquire would, in six
--   calls (EXISTS, HMGET, ZCARD of the queue, TIME, ZADD of the holders, HSET; for a permit a
--   ZADD GT of the fence key with its token, and a ZSCORE of it for the first permit token since
--   the name was idle; a PEXPIREAT of the keys when the new lease ends past `~exp`).
-- None loads the queue library. Anything else (a free name in use, a re-entry or a waiter's
-- claim, a fence key that is not a sorted set of ours, a semaphore asked for more than it has)
-- falls through to the general path, which sees the name exactly as it was.
-- KEYS[], ARGV[] and replies: those of queue_acquire.
-- The fence key is written here (`ZADD XX GT CH`, as the plain mutex does), so the meta hash
-- leaves `~fence` out: queue_lib's `mint` then reads the fence key, and an idle name's release
-- has no token to write back.
do
  local op, units, cap = ARGV[2], tonumber(ARGV[4]), tonumber(ARGV[5])
  if ARGV[10] ~= 'again' and (op ~= 's' or (units and cap and units <= cap))
      and redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3]) == 0 then
    local clock = redis.call('TIME')
    local secs, micros = tonumber(clock[1]), tonumber(clock[2])
    local stamp = secs * 1000000 + micros
    local token = string.format('%d', stamp)
    -- The fence key raised to the token (keys_lib): `fenced` once it is. A read hold takes no
    -- token, but a fence key that is not ours is refused all the same (by the general path).
    local fenced = op ~= 'r' and redis.pcall('ZADD', KEYS[4], 'XX', 'GT', 'CH', token, '~') == 1
    if not fenced then
      local bad, last = fence_last(KEYS[4], 4, true)
      fenced = not bad
      if fenced and op ~= 'r' then
        -- Above the last token, or for a new fence key a second ahead of the clock (as
        -- queue_lib's mint); a key made here lives for the fence key's lifetime.
        token = string.format('%d', last and math.max(last + 1, stamp) or stamp + 1000000)
        fence_raise(KEYS[4], token, ARGV[8])
      end
    end
    if fenced then
      -- The lease's end in ms by the server clock, and the keys' expiry (keys_lib's
      -- queue_expiry). The fields are written in one HSET, without building a table.
      local owner = ARGV[3]
      local ends = secs * 1000 + (micros - micros % 1000) / 1000 + tonumber(ARGV[6])
      local at = queue_expiry(ends)
      if op == 'x' or op == 'w' then
        redis.call('HSET', KEYS[1], '~layout', ARGV[1], '~cap', cap or 0, '~next', ends,
                   '~exp', at, '~used', 0, '~writer', owner, '~wholds', 1, '~wfence', token,
                   '~wexp', ends)
        redis.call('PEXPIREAT', KEYS[1], at)
        return {1, token, 1, string.format('%d', stamp)}
      end
      local fence = token
      if op == 'r' then
        units, fence, token = 1, '', 0
      end
      redis.call('ZADD', KEYS[2], ends, owner, '+inf', '~')
      redis.call('PEXPIREAT', KEYS[2], at)
      redis.call('HSET', KEYS[1], '~layout', ARGV[1], '~cap', cap or 0, '~next', ends,
                 '~exp', at, '~used', units, 'h:' .. owner, units .. '/' .. fence .. '/')
      redis.call('PEXPIREAT', KEYS[1], at)
      return {1, token, units, string.format('%d', stamp)}
    end
  elseif ARGV[10] == 'new' and units and cap then
    -- A fresh owner that finds the name held against it queues, or joins the shared holders
    -- (see the header).
    local owner = ARGV[3]
    local m = redis.pcall('HMGET', KEYS[1], '~layout', '~next', '~used', '~writer', '~seq',
                          'h:' .. owner, '~exp', '~cap', '~fence')
    if type(m) == 'table' and not m.err and m[1] == ARGV[1] and not m[6] and m[4] ~= owner then
      local used = tonumber(m[3]) or 0
      local busy
      if op == 'x' or op == 'w' then
        busy = m[4] or used > 0
      elseif op == 'r' then
        busy = m[4]
      else
        busy = tonumber(m[8]) == cap and units <= cap and used + units > cap
      end
      if not busy and used > 0
          and (op == 'r' or (op == 's' and tonumber(m[8]) == cap and used + units <= cap)) then
        -- Nobody waits: no queue, or one holding only `~`.
        local waiting = redis.pcall('ZCARD', KEYS[3])
        local clock = type(waiting) == 'number' and waiting <= 1 and redis.call('TIME')
        local now = clock and tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
        local nxt, ends = tonumber(m[2]) or 0, (now or 0) + tonumber(ARGV[6])
        -- No lease has ended, and this one does not end first (`~next` stays).
        if clock and now < nxt and ends >= nxt then
          local n, token, last = 1, 0, 0
          if op == 's' then
            -- A new fencing token, as queue_lib's mint makes it.
            n, last = units, tonumber(m[9])
            if not last then
              -- No fence key (queue_lib's mint starts one) or a foreign one: the general path.
              local bad
              bad, last = fence_last(KEYS[4], 4, true)
              if bad then last = nil end
            end
            token = last and string.format('%d',
              math.max(last + 1, tonumber(clock[1]) * 1000000 + tonumber(clock[2])))
          end
          if last then
            -- With `~`, as every holders key: one made here takes the name's expiry.
            local made = redis.call('ZADD', KEYS[2], ends, owner, '+inf', '~') == 2
            local fields = {'h:' .. owner, n .. '/' .. (op == 's' and token or '') .. '/',
                            '~used', used + n}
            if op == 's' then
              fields[#fields + 1] = '~fence'
              fields[#fields + 1] = token
              -- The fence key holds it at once (queue_lib's mint).
              fence_raise(KEYS[4], token, ARGV[8])
            end
            local exp = tonumber(m[7]) or 0
            local at = queue_expiry(ends)
            if at > exp then
              -- The keys live past the latest lease end (keys_lib's queue_expiry).
              fields[#fields + 1] = '~exp'
              fields[#fields + 1] = at
              redis.call('PEXPIREAT', KEYS[1], at)
              redis.call('PEXPIREAT', KEYS[2], at)
              if waiting == 1 then redis.call('PEXPIREAT', KEYS[3], at) end
            elseif made and exp > 0 then
              redis.call('PEXPIREAT', KEYS[2], exp)
            end
            redis.call('HSET', KEYS[1], unpack(fields))
            return {1, token, n,
                    string.format('%d', tonumber(clock[1]) * 1000000 + tonumber(clock[2]))}
          end
        end
      end
      local clock = busy and (tonumber(ARGV[7]) or 0) > 0 and redis.call('TIME')
      local now = clock and tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
      -- Before `~next`, no lease has ended (it is a lower bound of every lease end).
      if clock and now < (tonumber(m[2]) or 0) then
        local stamp = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
        local ticket = string.format('%d', math.max((tonumber(m[5]) or 0) + 1, stamp))
        local place = ARGV[11] .. '/' .. owner .. '/' .. op .. ARGV[4] .. '/' .. ARGV[6] .. '/'
                      .. ARGV[7]
        local added = redis.call('ZADD', KEYS[3], 'NX', ticket, place, '+inf', '~')
        if added == 0 then
          -- Queued already by an earlier attempt whose answer was lost: it keeps its place.
          return {0, tonumber(m[2]) - now, tonumber(redis.call('ZSCORE', KEYS[3], place))}
        end
        if added == 2 then
          -- A new queue key lives as long as the others.
          local at = tonumber(m[7]) or 0
          if at > 0 then redis.call('PEXPIREAT', KEYS[3], at) end
        end
        redis.call('HSET', KEYS[1], '~seq', ticket)
        return {0, tonumber(m[2]) - now, tonumber(ticket)}
      end
    end
  end
end
