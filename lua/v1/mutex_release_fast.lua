-- name:    mutex_release_fast
-- layout:  1 (see mutex_release)
-- Runs in mutex_release before mutex_lib is loaded: the release of a hold as its grant left it
-- (held once by this owner, no waiter marked it) is a compare-and-delete, as the minimal lock's
-- release is: GET, and DEL when the lock is exactly the string the grant wrote (mutex_lib's
-- mutex_value: ARGV[4], or ARGV[1] when it comes alone); the reply is then the integer 2 (as
-- {2, 0}). Anything else (a hold re-entered, a waiter's `w`, another owner, a key that is not a
-- string, no string given) falls through to mutex_release, which reads the lock itself.
-- KEYS[], ARGV[] and replies: those of mutex_release.
local expected = ARGV[4] or (#ARGV == 1 and ARGV[1])
if expected and redis.pcall('GET', KEYS[1]) == expected then
  redis.call('DEL', KEYS[1])
  return 2
end
