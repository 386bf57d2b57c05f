-- name:    mutex_acquire
-- layout:  1 (hash tag "mutex:1" in field "~layout")
-- KEYS[1]: lock hash   <prefix>:{<name>}        owner token -> hold count, plus "~layout" and "~fence"
-- KEYS[2]: fence key   <prefix>:{<name>}:fence  last fencing token issued for this name
-- ARGV[1]: owner token (the hold count field)
-- ARGV[2]: lease in milliseconds
-- ARGV[3]: lifetime of the fence key in milliseconds (refreshed on every fresh acquisition)
-- ARGV[4]: claim: new (a token made for this call: if it already holds, an earlier attempt's
--          answer was lost, and that hold is returned, its lease made at least ARGV[2] again),
--          as (join the owner's holds, or take the lock) or again (re-entry only: add a hold
--          only if the owner holds)
-- ARGV[5]: optional floor for a fresh token (a Redlock client's proposal, the same to every
--          node): the token is then max(last + 1, floor), without the server clock, so that
--          nodes whose counters were below it all grant the same token (a floor of 0 stands
--          for the server clock: the client has no proposal yet); a fresh grant then also
--          returns the server clock in µs, from which the client makes its next proposals
-- returns: {1, fence, holds}  acquired; holds is this owner's hold count after the call
--          {1, fence, 1, now}  acquired afresh with a floor: now is the server clock in µs
--          {0, pttl}          held by another owner; pttl is its remaining lease in ms (-2:
--                             free, but the claim was `again` and the owner holds nothing)
--          {-1, type, i}      KEYS[i] holds foreign data of that Redis type
--          {-2, layout}       the lock hash carries another layout tag
local LAYOUT = 'mutex:1'
local lock, fence = KEYS[1], KEYS[2]
local owner, lease, claim = ARGV[1], ARGV[2], ARGV[4]

local kind = redis.call('TYPE', lock)['ok']
if kind == 'none' and claim == 'again' then return {0, -2} end
if kind == 'none' then
  local last = 0
  local fkind = redis.call('TYPE', fence)['ok']
  if fkind == 'string' then
    last = tonumber(redis.call('GET', fence))
    if last == nil then return {-1, 'string', 2} end
  elseif fkind ~= 'none' then
    return {-1, fkind, 2}
  end
  -- Strictly above the last token, and never below the server clock in microseconds (or the
  -- caller's floor), so the sequence keeps rising even after the fence key has expired.
  local now = redis.call('TIME')
  now = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local floor = tonumber(ARGV[5] or '0')
  if floor == nil or floor <= 0 then floor = now end
  local token = math.max(last + 1, floor)
  token = string.format('%.0f', token)
  redis.call('SET', fence, token, 'PX', ARGV[3])
  redis.call('HSET', lock, owner, 1, '~layout', LAYOUT, '~fence', token)
  redis.call('PEXPIRE', lock, lease)
  if ARGV[5] then return {1, token, 1, string.format('%.0f', now)} end
  return {1, token, 1}
end
if kind ~= 'hash' then return {-1, kind, 1} end

local layout = redis.call('HGET', lock, '~layout')
if layout ~= LAYOUT then return {-2, layout or ''} end

if redis.call('HEXISTS', lock, owner) == 1 then
  if claim == 'new' then
    -- The same acquisition asked again (its answer was lost): it counts its lease from now.
    if redis.call('PTTL', lock) < tonumber(lease) then redis.call('PEXPIRE', lock, lease) end
    return {1, redis.call('HGET', lock, '~fence'), tonumber(redis.call('HGET', lock, owner))}
  end
  local holds = redis.call('HINCRBY', lock, owner, 1)
  if redis.call('PTTL', lock) < tonumber(lease) then redis.call('PEXPIRE', lock, lease) end
  return {1, redis.call('HGET', lock, '~fence'), holds}
end
return {0, redis.call('PTTL', lock)}
