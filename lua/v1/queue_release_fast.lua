-- name:    queue_release_fast
-- layout:  1 (see queue_acquire)
-- Runs first in queue_release, before keys_lib and queue_lib are loaded: the release of the
-- last hold of the only holder while nobody waits (no queue key), before any lease ran out,
-- which leaves the name idle: the keys go, in four calls (EXISTS, HMGET, TIME, DEL; a SET of
-- the fence key too when a hand-over issued a token since the name was last idle) and none of
-- the libraries' set-up. Anything else falls through to the general path, which sees the name
-- exactly as it was.
-- KEYS[], ARGV[] and replies: those of queue_release.
do
  local op, owner = ARGV[2], ARGV[3]
  if op ~= 'q' and op ~= 'Q' and redis.call('EXISTS', KEYS[3]) == 0 then
    local m = redis.pcall('HMGET', KEYS[1], '~layout', '~next', '~used', '~writer', '~wholds',
                          '~fence', 'h:' .. owner)
    if type(m) == 'table' and not m.err and m[1] == ARGV[1] then
      local used = tonumber(m[3]) or 0
      local last
      if op == 'x' or op == 'w' then
        last = m[4] == owner and m[5] == '1' and used == 0 and not m[7]
      else
        local n = tonumber(string.match(m[7] or '', '^(%d+)/'))
        last = not m[4] and n ~= nil and n == used and (op == 's' or n == 1)
      end
      if last then
        local clock = redis.call('TIME')
        local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
        -- Before `~next`, no lease has ended (it is a lower bound of every lease end).
        if now < (tonumber(m[2]) or 0) then
          if m[6] then redis.call('SET', KEYS[4], m[6], 'PX', ARGV[5]) end
          redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
          return {2}
        end
      end
    end
  end
end
