-- Claim a batch of records for processing, one round trip for the whole batch.
-- For each (entry_id, record_id): if the record's idempotency marker exists it is done already, so the
-- marker's TTL is refreshed and the entry acknowledged (1); otherwise the record's lock is taken with
-- SET NX EX and our owner token (0), or left alone because another worker holds it (2).
-- KEYS[1] input stream
-- ARGV: group, token, lock_ttl_seconds, marker_ttl_seconds, lock_prefix, marker_prefix, then id/record pairs.
local group, token, lock_ttl, marker_ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local lock_prefix, marker_prefix = ARGV[5], ARGV[6]
local result = {}
for i = 7, #ARGV, 2 do
  local entry_id, record_id = ARGV[i], ARGV[i + 1]
  local marker = marker_prefix .. record_id
  -- EXISTS, then EXPIRE on the rare hit: a cheaper call than GETEX for the usual miss.
  if redis.call('EXISTS', marker) == 1 then
    redis.call('EXPIRE', marker, marker_ttl)
    redis.call('XACK', KEYS[1], group, entry_id)
    result[#result + 1] = 1
  elseif redis.call('SET', lock_prefix .. record_id, token, 'NX', 'EX', lock_ttl) then
    result[#result + 1] = 0
  else
    result[#result + 1] = 2
  end
end
return result
