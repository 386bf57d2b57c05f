-- name:    mutex_lib
-- layout:  1 (the plain mutex's string is tagged "mutex:2"; "mutex:1", a hash, is refused)
-- Prepended to the mutex_* scripts, inspect and force_unlock: reads and writes a held plain
-- mutex, which is one string under <prefix>:{<name>}:
--   'mutex:2 <token> <holds> <wait> <owner>'
-- token: the hold's fencing token; holds: the owner's hold count; wait: 'w' once a waiter found
-- the lock busy (its last release publishes a wake-up), '-' while nobody did; owner: the owner
-- token. The key's TTL is the lease. The fencing counter is a separate string,
-- <prefix>:{<name>}:fence, that outlives the holds.
-- KEYS[]:  none (the functions take their key as a parameter)
-- ARGV[]:  none
-- returns: nothing (a library)
local MUTEX = 'mutex:2'

-- The mutex held under `lock` (KEYS[i] of the calling script): nil when nothing is stored
-- there, else {token, holds, wait, owner}; or nil and an error reply for data redlatch did not
-- write ({-1, type, i}) or another layout ({-2, layout}; '' for a hash without a layout tag),
-- or the error of the read itself (a table with `err`, for the script to return as it is).
local function mutex_read(lock, i)
  local v = redis.pcall('GET', lock)
  if type(v) == 'table' and v.err then
    if not string.find(v.err, 'WRONGTYPE', 1, true) then return nil, v end
    local kind = redis.call('TYPE', lock)['ok']
    if kind == 'hash' then return nil, {-2, redis.call('HGET', lock, '~layout') or ''} end
    return nil, {-1, kind, i}
  end
  if not v then return nil end
  local token, holds, wait, owner = string.match(v, '^mutex:2 (%d+) (%d+) ([-w]) (.+)$')
  if token then return {token = token, holds = tonumber(holds), wait = wait, owner = owner} end
  -- Another version's mutex, or a queued primitive's single hold (queue_lib's thin form).
  local layout = string.match(v, '^(%l+:%d+) ')
  if layout then return nil, {-2, layout} end
  return nil, {-1, 'string', i}
end

-- The string of a mutex held `holds` times by `owner` with fencing token `token`.
local function mutex_value(token, holds, wait, owner)
  return MUTEX .. ' ' .. token .. ' ' .. holds .. ' ' .. wait .. ' ' .. owner
end

-- ==== end of mutex_lib ====
