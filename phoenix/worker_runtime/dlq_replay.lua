-- Move up to ARGV[1] entries from the DLQ back into the input stream, atomically per call: each entry is
-- in exactly one of the two. The failure fields are dropped, retry_count reset to 0, and original_id kept
-- so a replayed record can be traced to the entry that first failed.
-- KEYS[1] dlq stream, KEYS[2] input stream. ARGV[1] count. The XADD never trims (see trim.lua).
local dropped = {error = true, error_type = true, stage = true, attempts = true, failed_at = true,
                 retry_count = true, first_failed_at = true, last_error = true}
local entries = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', tonumber(ARGV[1]))
for _, entry in ipairs(entries) do
  local fields = entry[2]
  local kept = {}
  for j = 1, #fields, 2 do
    if not dropped[fields[j]] then
      kept[#kept + 1] = fields[j]
      kept[#kept + 1] = fields[j + 1]
    end
  end
  kept[#kept + 1] = 'retry_count'
  kept[#kept + 1] = '0'
  redis.call('XADD', KEYS[2], '*', unpack(kept))
  redis.call('XDEL', KEYS[1], entry[1])
end
return #entries
