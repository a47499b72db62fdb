-- Keep a live worker's long jobs: extend each lock it still owns and reset the entry's idle time
-- (XCLAIM ... JUSTID to itself) so XAUTOCLAIM elsewhere does not take it. Returns the lost record ids.
-- KEYS[1] input stream
-- ARGV: group, consumer, lock_value (our lock: 'lock ' .. token), lock_ttl_seconds, record_prefix,
--       then entry_id/record_id pairs.
local group, consumer, lock_value, lock_ttl, record_prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local lost = {}
for i = 6, #ARGV, 2 do
  local entry_id, record_id = ARGV[i], ARGV[i + 1]
  local key = record_prefix .. record_id
  if redis.call('GET', key) == lock_value then
    redis.call('EXPIRE', key, lock_ttl)
    redis.call('XCLAIM', KEYS[1], group, consumer, 0, entry_id, 'JUSTID')
  else
    lost[#lost + 1] = record_id
  end
end
return lost
