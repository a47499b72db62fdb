-- Keep a live worker's long jobs: extend each lock it still owns and reset the entry's idle time
-- (XCLAIM ... JUSTID to itself) so XAUTOCLAIM elsewhere does not take it. Returns the lost record ids.
-- KEYS[1] input stream, then the records' keys (record_prefix .. record_id), one per pair of ARGV in order:
--   KEYS[1 + n] is pair n's.
-- ARGV: group, consumer, lock_value (our lock: 'lock ' .. token), lock_ttl_seconds, then entry_id/record_id pairs.
local group, consumer, lock_value, lock_ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local lost = {}
local pair = 0
for i = 5, #ARGV, 2 do
  local entry_id, record_id = ARGV[i], ARGV[i + 1]
  pair = pair + 1
  local key = KEYS[1 + pair]
  if redis.call('GET', key) == lock_value then
    redis.call('EXPIRE', key, lock_ttl)
    redis.call('XCLAIM', KEYS[1], group, consumer, 0, entry_id, 'JUSTID')
  else
    lost[#lost + 1] = record_id
  end
end
return lost
