-- name:    elect_leader
-- layout:  1 (tag "election:1"; see elect_proclaim; writes nothing)
-- Reads who leads an election now: the leader's record, if its term is the fencing token of
-- the exclusive hold and that hold's lease has not run out.
-- KEYS[1]: meta hash  <prefix>:{<name>}
-- KEYS[2]: fence key  <prefix>:{<name>}:fence (optional; read only)
-- ARGV[1]: layout tag
-- returns: {1, term, seq, ms, value}  the leader of `term` said `value` (version seq of the
--                                     term), and its lease has `ms` left
--          {0, term, seq}             nobody leads; (term, seq) is the version of what the
--                                     name last showed: a new holder that has not spoken yet
--                                     (its term, 0), a resign or a record whose lease ran out
--                                     (its version), or nothing (0, 0)
--          {0, last, -1}              nobody leads, the name is idle (its keys gone), and every
--                                     term up to `last`, the fence key's last token, is over:
--                                     whatever their records said is past (0 when the fence key
--                                     is gone, or is not ours)
--          {-1, type, 1}              KEYS[1] holds foreign data of that Redis type
--          {-2, layout}               the meta hash carries another layout tag, or the
--                                     name's key is another primitive's string
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then
  -- Every term issued so far is at most the fence key's last token (a release that leaves the
  -- name idle raises the key to the last token it knew).
  local last = KEYS[2] and redis.pcall('ZSCORE', KEYS[2], '~')
  if type(last) == 'string' and string.match(last, '^%d+$') then return {0, last, -1} end
  return {0, 0, 0}
end
if t == 'string' then
  -- Another primitive's string, read as mutex_lib reads one (a plain mutex's, or a queued
  -- primitive's thin hold): the name is in use as that primitive, which is not foreign data.
  local other = string.match(redis.call('GET', KEYS[1]), '^(%l+:%d+) ')
  if other then return {-2, other} end
end
if t ~= 'hash' then return {-1, t, 1} end
local m = redis.call('HMGET', KEYS[1], '~layout', '~writer', '~wfence', '~wexp', '~lterm',
                     '~lseq', '~lvalue')
if not m[1] then return {-1, 'hash', 1} end
if m[1] ~= ARGV[1] then return {-2, m[1]} end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local left = (tonumber(m[4]) or 0) - now
local live = m[2] and m[3] and left > 0
if live and m[5] == m[3] and m[7] then
  return {1, m[3], tonumber(m[6]) or 0, left, m[7]}
end
if live and m[5] ~= m[3] then return {0, m[3], 0} end
return {0, m[5] or 0, tonumber(m[6]) or 0}
