-- Claim a batch of records for processing, one round trip for the whole batch, one call per record.
-- Each record's key (record_prefix .. record_id) is taken with SET NX GET: absent, it now holds our lock (0);
-- holding a marker (a value starting with done_prefix), the record is processed already, so the marker's TTL is
-- refreshed and the entry acknowledged (1); holding another worker's lock, it is left alone (2).
-- KEYS[1] input stream
-- ARGV: group, lock_value (our lock: 'lock ' .. token), lock_ttl_seconds, marker_ttl_seconds, record_prefix,
--       done_prefix, then entry_id/record_id pairs.
local group, lock_value, lock_ttl, marker_ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local record_prefix, done_prefix = ARGV[5], ARGV[6]
local done_len = #done_prefix
local result = {}
for i = 7, #ARGV, 2 do
  local entry_id, key = ARGV[i], record_prefix .. ARGV[i + 1]
  local old = redis.call('SET', key, lock_value, 'NX', 'GET', 'EX', lock_ttl)
  if not old then
    result[#result + 1] = 0
  elseif string.sub(old, 1, done_len) == done_prefix then
    redis.call('EXPIRE', key, marker_ttl)
    redis.call('XACK', KEYS[1], group, entry_id)
    result[#result + 1] = 1
  else
    result[#result + 1] = 2
  end
end
return result
