-- Keep a live worker's long jobs: extend each lock it still owns and reset the entry's idle time
-- (XCLAIM ... JUSTID to itself) so XAUTOCLAIM elsewhere does not take it. Returns the lost record ids.
-- A key holding the marker of the entry's own commit is not lost: the settle call wrote it and has not answered
-- yet (with MIN_REPLICAS_ACK it waits for replicas meanwhile).
-- KEYS[1] input stream, then the records' keys (record_prefix .. record_id), one per pair of ARGV in order:
--   KEYS[1 + n] is pair n's.
-- ARGV: group, consumer, lock_value (our lock: 'lock ' .. token), lock_ttl_seconds, done_prefix,
--       then entry_id/record_id pairs.
local group, consumer, lock_value, lock_ttl, done_prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local lost = {}
local pair = 0
for i = 6, #ARGV, 2 do
  local entry_id, record_id = ARGV[i], ARGV[i + 1]
  pair = pair + 1
  local key = KEYS[1 + pair]
  local value = redis.call('GET', key)
  if value == lock_value then
    redis.call('EXPIRE', key, lock_ttl)
    redis.call('XCLAIM', KEYS[1], group, consumer, 0, entry_id, 'JUSTID')
  elseif value ~= done_prefix .. entry_id then
    lost[#lost + 1] = record_id
  end
end
return lost
