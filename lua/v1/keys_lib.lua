-- name:    keys_lib
-- layout:  1
-- Prepended to the queue_*, inspect and force_unlock scripts: tells redlatch's own keys from
-- data it did not write, which every script refuses and leaves exactly as it is.
-- KEYS[]:  none (the function takes its key as a parameter)
-- ARGV[]:  none
-- returns: nothing (a library)
-- Our sorted sets (holders, queue) always carry the member `~` at +inf while they exist; a
-- fence key is a string holding a decimal number.

-- Checks `key` (KEYS[i] of the calling script) against what redlatch keeps there: 'zset' (a
-- sorted set carrying `~`) or 'counter' (a decimal number). Returns nil when the key is absent
-- or ours (and, for a counter, its value or false), else the error reply {-1, type, i}.
local function foreign(key, kind, i)
  if kind == 'counter' then
    local v = redis.pcall('GET', key)
    if type(v) == 'table' and v.err then return {-1, redis.call('TYPE', key)['ok'], i} end
    if v and not tonumber(v) then return {-1, 'string', i} end
    return nil, v
  end
  local t = redis.call('TYPE', key)['ok']
  if t == 'none' then return nil end
  if t ~= 'zset' then return {-1, t, i} end
  if not redis.call('ZSCORE', key, '~') then return {-1, 'zset', i} end
  return nil
end

-- ==== end of keys_lib ====
