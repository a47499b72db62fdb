-- Move up to ARGV[1] entries from the DLQ back into the input stream, atomically per call: each entry is
-- in exactly one of the two. The failure fields are dropped, retry_count reset to 0, and original_id kept
-- so a replayed record can be traced to the entry that first failed. Its entry time and deadline are dropped too:
-- a replay asks for the record to be done now (an Expired one would expire again), its age counted from the replay.
-- Entries that could only fail again stay in the DLQ: packed ones (the packed field holds the fields of an entry
-- too wide for the scripts) and ones of more values than one unpack can give (Lua 5.1 stops near 8,000).
-- KEYS[1] dlq stream, KEYS[2] input stream. ARGV[1] count, ARGV[2] the first id to look at ('-', or '(' and an id:
-- after it), ARGV[3] most values unpacked, ARGV[4] the packed field's name. The XADD never trims (see trim.lua).
-- Returns {entries moved, entries looked at, id of the last one looked at ('' if none)}.
local dropped = {error = true, error_type = true, stage = true, attempts = true, failed_at = true,
                 retry_count = true, first_failed_at = true, last_error = true, entered_at = true, deadline = true}
local max_values, packed_field = tonumber(ARGV[3]), ARGV[4]
local entries = redis.call('XRANGE', KEYS[1], ARGV[2], '+', 'COUNT', tonumber(ARGV[1]))
local moved = 0
for _, entry in ipairs(entries) do
  local fields = entry[2]
  local kept, replayable = {}, #fields + 2 <= max_values
  for j = 1, #fields, 2 do
    if fields[j] == packed_field then
      replayable = false
    elseif not dropped[fields[j]] then
      kept[#kept + 1] = fields[j]
      kept[#kept + 1] = fields[j + 1]
    end
  end
  if replayable then
    kept[#kept + 1] = 'retry_count'
    kept[#kept + 1] = '0'
    redis.call('XADD', KEYS[2], '*', unpack(kept))
    redis.call('XDEL', KEYS[1], entry[1])
    moved = moved + 1
  end
end
return {moved, #entries, #entries > 0 and entries[#entries][1] or ''}
