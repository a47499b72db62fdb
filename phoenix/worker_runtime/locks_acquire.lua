-- Claim a batch of records for processing, one round trip for the whole batch, one call per record.
-- Each record's key (record_prefix .. record_id) is taken with SET NX GET: absent, it now holds our lock;
-- holding a marker (a value starting with done_prefix), the record is processed already, so the marker's TTL is
-- refreshed and the entry acknowledged (1); holding another worker's lock, it is left alone (2).
-- Returns position (from 1), code pairs for the records not acquired only: usually none.
-- KEYS[1] input stream
-- ARGV: group, lock_value (our lock: 'lock ' .. token), lock_ttl_seconds, marker_ttl_seconds, record_prefix,
--       done_prefix, then entry_id/record_id pairs.
local group, lock_value, lock_ttl, marker_ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local record_prefix, done_prefix = ARGV[5], ARGV[6]
local done_len = #done_prefix
local refused, n, position = {}, 0, 0
for i = 7, #ARGV, 2 do
  position = position + 1
  local key = record_prefix .. ARGV[i + 1]
  local old = redis.call('SET', key, lock_value, 'NX', 'GET', 'EX', lock_ttl)
  if old then
    local code = 2
    if string.sub(old, 1, done_len) == done_prefix then
      redis.call('EXPIRE', key, marker_ttl)
      redis.call('XACK', KEYS[1], group, ARGV[i])
      code = 1
    end
    refused[n + 1], refused[n + 2] = position, code
    n = n + 2
  end
end
return refused
