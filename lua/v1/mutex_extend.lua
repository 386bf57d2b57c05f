-- name:    mutex_extend
-- layout:  1 (the held mutex is the string "mutex:2" of mutex_lib)
-- KEYS[i]: locks <prefix>:{<name>}, one per hold to extend (the watchdog batches them)
-- ARGV[2i-1]: owner token of KEYS[i]
-- ARGV[2i]:   lease in milliseconds for KEYS[i]; the remaining lease becomes at least this
-- returns: one integer per key:
--           1  extended (or its remaining lease was already longer)
--           0  not held by this owner (expired, released or taken by another)
--          -1  the key holds foreign data
--          -2  the key holds another layout
local out = {}
for i, lock in ipairs(KEYS) do
  local owner, lease = ARGV[2 * i - 1], ARGV[2 * i]
  local held, bad = mutex_read(lock, i)
  if bad and bad.err then
    return bad
  elseif bad then
    out[i] = bad[1]
  elseif held and held.owner == owner then
    if redis.call('PTTL', lock) < tonumber(lease) then redis.call('PEXPIRE', lock, lease) end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
