-- name:    calls_lib
-- layout:  1
-- Prepended to every queue_* script and to force_unlock, first: one command over a table of
-- arguments of any length (Lua's unpack puts at most about 8,000 values on the stack, and a
-- hand-over that lets thousands of readers in, or a purge of thousands of holders whose leases
-- ran out, gathers more arguments than that for one command); and the messages that name
-- queued waiters, each on its own client's channel.
-- KEYS[]:  none (the function takes its key as a parameter)
-- ARGV[]:  none
-- returns: nothing (a library)

-- Runs `cmd key [flag] args...`, in parts of at most 1,000 of `args` each (an even number, so
-- field-value and score-member pairs stay together), each part after `key` and `flag` (an
-- option such as GT, or nil). Up to 1,000 arguments it is one call. Returns the sum of the
-- parts' integer replies, or their array replies joined in order.
local function call_all(cmd, key, args, flag)
  local n, sum, joined = #args, 0, nil
  for i = 1, n, 1000 do
    local j = math.min(i + 999, n)
    local r
    if flag then
      r = redis.call(cmd, key, flag, unpack(args, i, j))
    else
      r = redis.call(cmd, key, unpack(args, i, j))
    end
    if type(r) == 'table' then
      joined = joined or {}
      for _, v in ipairs(r) do joined[#joined + 1] = v end
    else
      sum = sum + r
    end
  end
  return joined or sum
end

-- Tells the waiters named in `told` (entries `client/owner[:fence:ms:ticket]`, in order): one
-- message per client, its entries space-separated in the same order, on that client's own
-- channel `<channel>:<client>`, so a hand-over wakes the process of the waiter it names and no
-- other. An entry without a client part goes on `channel` itself.
local function tell(channel, told)
  if #told == 1 then
    local c = string.match(told[1], '^([^/]*)/') or ''
    redis.call(PUBLISH, c == '' and channel or channel .. ':' .. c, told[1])
    return
  end
  local by, order = {}, {}
  for _, t in ipairs(told) do
    local c = string.match(t, '^([^/]*)/') or ''
    local list = by[c]
    if not list then
      list = {}
      by[c] = list
      order[#order + 1] = c
    end
    list[#list + 1] = t
  end
  for _, c in ipairs(order) do
    redis.call(PUBLISH, c == '' and channel or channel .. ':' .. c, table.concat(by[c], ' '))
  end
end

-- ==== end of calls_lib ====
