-- name:    elect_proclaim
-- layout:  1 (tag "election:1" in field "~layout" of the meta hash; the election is a fair
--          mutex's state under its own tag, with the leader's record beside it)
-- The leader's record: what the leader of a term says (its value), and the record's version.
-- The holder of the election's exclusive hold writes it (after campaign, on proclaim, and on
-- resign, which removes the value), and every write is published on the wake-up channel, so
-- observers see each change in order. Queue scripts leave these fields as they are; the record
-- is read as the leader's only while its term is the exclusive hold's fencing token.
-- KEYS[1]: meta hash  <prefix>:{<name>}
-- ARGV[1]: layout tag
-- ARGV[2]: owner token of the leader
-- ARGV[3]: its term (the hold's fencing token)
-- ARGV[4]: p (proclaim ARGV[6]) or r (resign: the value is removed)
-- ARGV[5]: wake-up channel <prefix>:{<name>}:wake
-- ARGV[6]: the value (proclaim only)
-- Fields: ~lterm (the term of the record), ~lseq (its version within the term, from 1),
--         ~lvalue (the value; absent after a resign)
-- Message: '=<term>:<seq>' followed by a newline and the value for a proclaim
-- returns: {1, seq}          written and published, as version seq of the term
--          {0}               this owner does not hold the election with this term now (its
--                            lease ran out, it resigned, the name is idle, or another
--                            primitive's string or state holds it)
--          {-1, type, 1}     KEYS[1] holds foreign data of that Redis type
--          {-2, layout}      the meta hash carries another version of the election's layout
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then return {0} end
if t == 'string' then
  -- Another primitive's string, read as mutex_lib reads one (a plain mutex's, or a queued
  -- primitive's thin hold): the name was freed and taken since, so this owner does not hold
  -- the election.
  if string.match(redis.call('GET', KEYS[1]), '^%l+:%d+ ') then return {0} end
end
if t ~= 'hash' then return {-1, t, 1} end
local m = redis.call('HMGET', KEYS[1], '~layout', '~writer', '~wfence', '~wexp', '~lterm',
                     '~lseq')
if not m[1] then return {-1, 'hash', 1} end
if m[1] ~= ARGV[1] then
  -- Another primitive's state (a queued primitive's tag): the name was freed and taken since.
  -- Another version of the election's own layout is the error.
  local kind = string.match(m[1], '^(%l+):%d+$')
  if kind and kind ~= string.match(ARGV[1], '^(%l+):') then return {0} end
  return {-2, m[1]}
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
if m[2] ~= ARGV[2] or m[3] ~= ARGV[3] or not tonumber(m[4]) or tonumber(m[4]) <= now then
  return {0}
end
local seq = 1
if m[5] == ARGV[3] and tonumber(m[6]) then seq = tonumber(m[6]) + 1 end
local head = '=' .. ARGV[3] .. ':' .. seq
if ARGV[4] == 'p' then
  redis.call('HSET', KEYS[1], '~lterm', ARGV[3], '~lseq', seq, '~lvalue', ARGV[6])
  redis.call(PUBLISH, ARGV[5], head .. '\n' .. ARGV[6])
else
  redis.call('HSET', KEYS[1], '~lterm', ARGV[3], '~lseq', seq)
  redis.call('HDEL', KEYS[1], '~lvalue')
  redis.call(PUBLISH, ARGV[5], head)
end
return {1, seq}
