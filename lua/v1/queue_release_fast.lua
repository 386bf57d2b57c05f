-- name:    queue_release_fast
-- layout:  1 (see queue_acquire)
-- Runs first in queue_release, before keys_lib and queue_lib are loaded, for the releases that
-- are common and simple, before any lease ran out (`~next` not passed):
-- * the last hold of the only holder while nobody waits, which leaves the name idle: the keys
--   go (HMGET, TIME, then ZPOPMIN for an exclusive hold or EXISTS before the HMGET for a shared
--   one, and DEL; a SET of the fence key too when a hand-over issued a token since the name
--   was last idle);
-- * the exclusive holder's last hold (a fair mutex, a write lock) with an exclusive waiter at
--   the head of the queue: the hold is handed over to it as queue_lib's handoff would (HMGET,
--   TIME, ZPOPMIN, HSET, PUBLISH; a GET of the fence key for the first token a hand-over
--   issues since the name was idle, a PEXPIREAT of the meta hash and queue when the new lease
--   ends past `~exp`), in about a third of the general path's server time.
-- Anything else falls through to the general path, which sees the name exactly as it was (a
-- head popped and not handed the hold is put back first).
-- KEYS[], ARGV[] and replies: those of queue_release.
do
  local op, owner = ARGV[2], ARGV[3]
  local excl = op == 'x' or op == 'w'
  if excl or ((op == 's' or op == 'r') and redis.call('EXISTS', KEYS[3]) == 0) then
    local m = redis.pcall('HMGET', KEYS[1], '~layout', '~next', '~used', '~writer', '~wholds',
                          '~fence', 'h:' .. owner, '~exp')
    if type(m) == 'table' and not m.err and m[1] == ARGV[1] then
      local used = tonumber(m[3]) or 0
      local last
      if excl then
        last = m[4] == owner and m[5] == '1' and used == 0 and not m[7]
      else
        local n = tonumber(string.match(m[7] or '', '^(%d+)/'))
        last = not m[4] and n ~= nil and n == used and (op == 's' or n == 1)
      end
      if last then
        local clock = redis.call('TIME')
        local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
        -- Before `~next`, no lease has ended (it is a lower bound of every lease end).
        local nxt = tonumber(m[2]) or 0
        if now < nxt then
          local head = excl and redis.call('ZPOPMIN', KEYS[3]) or {}
          local w = head[1]
          if not w or w == '~' then
            -- Nobody waits (a queue key holding only `~` is gone now, as the DEL would make it).
            if m[6] then redis.call('SET', KEYS[4], m[6], 'PX', ARGV[5]) end
            redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
            return {2}
          end
          -- A waiter: client/owner/<op><units>/<lease>/<grace> (see queue_lib's member).
          local c, o, wop, _, lease, grace =
            string.match(w, '^([^/]*)/([^/]+)/(%a)(%d+)/(%d+)/(%d+)$')
          local term = c and math.max(math.min(tonumber(lease), tonumber(grace)), 1)
          -- A hold that ends before `~next` would have to tell the queue (the general path).
          if c ~= nil and c ~= '' and (wop == 'x' or wop == 'w') and now + term >= nxt then
            local fence = tonumber(m[6])
            if not fence then
              local stored = redis.pcall('GET', KEYS[4])
              fence = type(stored) ~= 'table' and tonumber(stored or '0')
            end
            if fence then
              local ends = now + term
              local token = string.format('%d',
                math.max(fence + 1, tonumber(clock[1]) * 1000000 + tonumber(clock[2])))
              local fields = {'~writer', o, '~wholds', 1, '~wfence', token, '~wexp', ends,
                              '~wclient', c, '~fence', token}
              if ends > (tonumber(m[8]) or 0) then
                -- The keys live until the latest lease end, rounded up to the next second.
                local at = (math.floor(ends / 1000) + 1) * 1000
                fields[#fields + 1] = '~exp'
                fields[#fields + 1] = at
                redis.call('PEXPIREAT', KEYS[1], at)
                redis.call('PEXPIREAT', KEYS[3], at)
              end
              redis.call('HSET', KEYS[1], unpack(fields))
              redis.call(PUBLISH, ARGV[4],
                         c .. '/' .. o .. ':' .. token .. ':' .. term .. ':' .. head[2])
              return {2}
            end
          end
          redis.call('ZADD', KEYS[3], head[2], w)
        end
      end
    end
  end
end
