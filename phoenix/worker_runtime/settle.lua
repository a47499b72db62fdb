-- Settle a batch of messages atomically, one round trip for the batch. Per item, by its code:
--   C commit:  the record's key becomes its idempotency marker (SET GET: whatever lock it held, ours or one
--              taken after ours expired, is replaced), and the result is XADDed to the output stream (when the item
--              has fields): record_id first, then the item's fields; then XACK. If the key held a marker already,
--              another message committed the record first: its marker is put back and nothing is forwarded (a
--              duplicate). Marker, forward and acknowledgement happen together or not at all, so a crash can
--              neither lose the record for the next stage nor forward it twice; a later claim finds the marker.
--   D dead-letter: XADD the fields to the DLQ, XACK.
--   R retry:   ZADD the message (a JSON array of fields) to the retry set, due in delay_ms; XACK.
--   L leave:   nothing; the entry stays pending for a later attempt (circuit open, shutdown).
-- D, R and L come in upper case when this worker holds the record's lock, which is then released if still ours
-- (compare-and-delete), in lower case when it took none (a malformed entry).
-- No XADD trims (MAXLEN cut unread entries): streams shrink through trim.lua, bounded by backpressure.
-- Returns per item 1 when a commit found the record committed already (a duplicate), else 0.
-- KEYS: input stream, output stream (or the input when the stage has no output), dlq stream, retry zset.
-- ARGV: group, lock_value (our lock: 'lock ' .. token), marker_ttl, record_prefix, done_prefix,
--       then items: code, entry_id, record_id, field_count, fields... (R's two fields: delay_ms, member)
local input, output, dlq, retry_set = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, lock_value, marker_ttl = ARGV[1], ARGV[2], ARGV[3]
local record_prefix, done_prefix = ARGV[4], ARGV[5]
local done_len = #done_prefix

local now_ms
local function server_now_ms()
  if not now_ms then
    local t = redis.call('TIME')
    now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now_ms
end

local result, acked = {}, {}
local i = 6
while i <= #ARGV do
  local code, entry_id, record_id, n = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])
  local first, last = i + 4, i + 3 + n
  local duplicate = 0
  if code == 'C' then
    local key = record_prefix .. record_id
    local old = redis.call('SET', key, done_prefix .. entry_id, 'GET', 'EX', marker_ttl)
    if old and string.sub(old, 1, done_len) == done_prefix then
      redis.call('SET', key, old, 'EX', marker_ttl)
      duplicate = 1
    elseif n > 0 then
      redis.call('XADD', output, '*', 'record_id', record_id, unpack(ARGV, first, last))
    end
    acked[#acked + 1] = entry_id
  else
    if code == 'D' or code == 'd' then
      redis.call('XADD', dlq, '*', unpack(ARGV, first, last))
      acked[#acked + 1] = entry_id
    elseif code == 'R' or code == 'r' then
      redis.call('ZADD', retry_set, server_now_ms() + tonumber(ARGV[first]), ARGV[first + 1])
      acked[#acked + 1] = entry_id
    end
    if code == 'D' or code == 'R' or code == 'L' then
      local key = record_prefix .. record_id
      if redis.call('GET', key) == lock_value then
        redis.call('DEL', key)
      end
    end
  end
  result[#result + 1] = duplicate
  i = last + 1
end
-- One XACK for the batch; chunked to stay far below Lua's limit on unpacked values.
for j = 1, #acked, 4000 do
  redis.call('XACK', input, group, unpack(acked, j, math.min(j + 3999, #acked)))
end
return result
