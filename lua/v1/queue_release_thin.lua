-- name:    queue_release_thin
-- layout:  1 (see queue_acquire; the thin form: keys_lib's thin_read, queue_lib's inflate)
-- Runs in queue_release before any library is loaded: the release of a single hold taken in
-- plain commands, while it is still the one string under the meta key (nobody else holds or
-- waits), is a compare-and-delete: GET, and DEL when the key is exactly the string the grant
-- wrote; the name is idle then. Anything else (the hold turned into the queue state, a key that
-- is not a string, no string given) falls through.
-- KEYS[], ARGV[] and replies: those of queue_release, or its short form: KEYS[1] and the
-- string alone (ARGV[1]), the rest derived from them (the other keys and the channel are the
-- meta key's with their suffixes; layout, op and owner the string's fields; the fence key's
-- lifetime FENCE_TTL_MS, the client's FENCE_TTL). The short form's compare-and-delete replies
-- with the integer 2, which stands for {2, 1}; where it falls through, the general path runs
-- with the long form's KEYS and ARGV.
if #ARGV == 1 then
  local thin = ARGV[1]
  if redis.pcall('GET', KEYS[1]) == thin then
    redis.call('DEL', KEYS[1])
    return 2
  end
  local FENCE_TTL_MS = '604800000'
  local meta = KEYS[1]
  KEYS[2], KEYS[3], KEYS[4] = meta .. ':holders', meta .. ':queue', meta .. ':fence'
  local layout, op, owner = string.match(thin, '^(%S+) (%S+) %S+ %S+ %S+ (%S+)$')
  ARGV[1], ARGV[2], ARGV[3] = layout or '', op or '', owner or ''
  ARGV[4], ARGV[5], ARGV[6] = meta .. ':wake', FENCE_TTL_MS, thin
elseif ARGV[6] and redis.pcall('GET', KEYS[1]) == ARGV[6] then
  redis.call('DEL', KEYS[1])
  return {2, 1}
end
