-- name:    queue_extend
-- layout:  1 (see queue_acquire)
-- KEYS[3i-2..3i]: meta hash, holders and queue of item i (see queue_lib); the watchdog
--                 batches the holds of many names in one call
-- ARGV[4i-3]: layout tag of item i
-- ARGV[4i-2]: w (the exclusive hold: renew its lease) or h (shared holds: read holds or a
--             permit); waiters have no deadline to renew
-- ARGV[4i-1]: owner token
-- ARGV[4i]:   milliseconds; the lease becomes at least this long from now (a thin hold's, the
--             meta key's TTL: see queue_lib)
-- returns: one integer per item:
--           1  extended (or it already ran longer)
--           0  not held by this owner any more: expired or released
--          -1  a key holds foreign data
--          -2  the meta hash carries another layout tag
local now = now_ms(redis.call('TIME'))

-- Renews the hold of an item (its keys from KEYS[k + 1], its arguments from ARGV[a + 1]) held
-- in the queue state: 1 renewed, 0 gone, or the error status.
local function renew(k, a, layout, what, owner)
  local s, err = open({KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], i = k + 1}, layout,
                      {'~layout', '~next', '~exp', '~writer', '~wexp', '~wclient', 'h:' .. owner})
  if not s then return err[1] end
  if not s.exists then return 0 end
  local status = 0
  local d = now + tonumber(ARGV[a + 4])
  local fields = {}
  -- A renewal is also the answer to a hand-over: it clears the hold's mark (queue_lib).
  if what == 'w' then
    local ends = num(s, '~wexp')
    if get(s, '~writer') == owner and ends > now then
      status = 1
      if d > ends then fields = {'~wexp', d} end
      if get(s, '~wclient') then redis.call('HDEL', s.m, '~wclient') end
    end
  elseif what == 'h' then
    -- A holders key of another type (put there while the name is in use) is this item's
    -- foreign data, not an error of the whole call, which renews other names' holds too.
    local score = redis.pcall('ZSCORE', s.h, owner)
    if type(score) == 'table' and score.err then return -1 end
    local ends = tonumber(score)
    if ends and ends > now then
      status = 1
      if d > ends then redis.call('ZADD', s.h, d, owner) end
      local n, f, c = shares(s, owner)
      if n and c ~= '' then fields = {'h:' .. owner, n .. '/' .. f .. '/'} end
    end
  end
  -- A later lease end never lowers ~next; it may push the keys' expiry.
  local exp = s.exp
  if status == 1 and queue_expiry(d) > exp then
    exp = queue_expiry(d)
    fields[#fields + 1] = '~exp'
    fields[#fields + 1] = exp
  end
  if #fields > 0 then redis.call('HSET', s.m, unpack(fields)) end
  if exp ~= s.exp then
    for _, key in ipairs({s.m, s.h, s.q}) do redis.call('PEXPIREAT', key, exp) end
  end
  return status
end

local out = {}
for i = 1, #KEYS / 3 do
  local k, a = 3 * (i - 1), 4 * (i - 1)
  local layout, what, owner = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  -- A thin hold (queue_lib) is renewed as it is: its lease is the meta key's TTL.
  local v = redis.pcall('GET', KEYS[k + 1])
  local one = type(v) == 'string' and thin_read(v)
  if one and one.layout == layout then
    out[i] = 0
    if one.owner == owner and (one.op == 'x' or one.op == 'w') == (what == 'w') then
      if redis.call('PTTL', KEYS[k + 1]) < tonumber(ARGV[a + 4]) then
        redis.call('PEXPIRE', KEYS[k + 1], ARGV[a + 4])
      end
      out[i] = 1
    end
  else
    out[i] = renew(k, a, layout, what, owner)
  end
end
return out
