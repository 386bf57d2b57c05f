-- name:    mutex_extend
-- layout:  1
-- KEYS[i]: lock hashes <prefix>:{<name>}, one per hold to extend (the watchdog batches them)
-- ARGV[2i-1]: owner token of KEYS[i]
-- ARGV[2i]:   lease in milliseconds for KEYS[i]; the remaining lease becomes at least this
-- returns: one integer per key:
--           1  extended (or its remaining lease was already longer)
--           0  not held by this owner (expired, released or taken by another)
--          -1  the key holds foreign data
--          -2  the lock hash carries another layout tag
local LAYOUT = 'mutex:1'
local out = {}
for i, lock in ipairs(KEYS) do
  local owner, lease = ARGV[2 * i - 1], ARGV[2 * i]
  local kind = redis.call('TYPE', lock)['ok']
  if kind == 'none' then
    out[i] = 0
  elseif kind ~= 'hash' then
    out[i] = -1
  elseif redis.call('HGET', lock, '~layout') ~= LAYOUT then
    out[i] = -2
  elseif redis.call('HEXISTS', lock, owner) == 1 then
    if redis.call('PTTL', lock) < tonumber(lease) then redis.call('PEXPIRE', lock, lease) end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
