-- name:    queue_release_thin
-- layout:  1 (see queue_acquire; the thin form: keys_lib's thin_read, queue_lib's inflate)
-- Runs in queue_release before any library is loaded: the release of a single hold taken in
-- plain commands, while it is still the one string under the meta key (nobody else holds or
-- waits), is a compare-and-delete: GET, and DEL when the key is exactly ARGV[6], the string the
-- grant wrote; the name is idle then. Anything else (the hold turned into the queue state, a
-- key that is not a string, no ARGV[6]) falls through.
-- KEYS[], ARGV[] and replies: those of queue_release.
if ARGV[6] and redis.pcall('GET', KEYS[1]) == ARGV[6] then
  redis.call('DEL', KEYS[1])
  return {2, 1}
end
