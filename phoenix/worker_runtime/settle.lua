-- Settle a batch of messages atomically, one round trip for the batch. Per item, by action:
--   C commit:  unless the marker exists already (another worker committed first), set the idempotency
--              marker with its TTL and XADD the result to the output stream (when it has fields); then XACK.
--              Marker, forward and acknowledgement happen together or not at all, so a crash can neither
--              lose the record for the next stage nor forward it twice.
--   D dead-letter: XADD the fields to the DLQ, XACK.
--   R retry:   ZADD the message (a JSON array of fields) to the retry set, due in delay_ms; XACK.
--   L leave:   nothing; the entry stays pending for a later attempt (circuit open, shutdown).
-- Every action then releases the record's lock if this worker still owns it (compare-and-delete); a commit
-- that set the marker deletes the lock without the compare: whoever else might hold it (after our lock expired)
-- can no longer commit the record, and every later claim finds the marker first. One call less per message.
-- No XADD trims (MAXLEN cut unread entries): streams shrink through trim.lua, bounded by backpressure.
-- Returns per item 1 when a commit found the marker already set (a duplicate), else 0.
-- KEYS: input stream, output stream (or the input when the stage has no output), dlq stream, retry zset.
-- ARGV: group, token, marker_ttl, lock_prefix, marker_prefix, has_output,
--       then items: action, entry_id, record_id, holds_lock (0/1), field_count, fields...
local input, output, dlq, retry_set = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, token, marker_ttl = ARGV[1], ARGV[2], ARGV[3]
local lock_prefix, marker_prefix = ARGV[4], ARGV[5]
local has_output = ARGV[6] == '1'

local now_ms
local function server_now_ms()
  if not now_ms then
    local t = redis.call('TIME')
    now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now_ms
end

local result, acked = {}, {}
local i = 7
while i <= #ARGV do
  local action, entry_id, record_id = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local holds_lock, n = ARGV[i + 3] == '1', tonumber(ARGV[i + 4])
  local first, last = i + 5, i + 4 + n
  local duplicate, release = 0, holds_lock
  if action == 'C' then
    -- The marker stores the entry id that committed the record: GET processed:... answers "by which message".
    if redis.call('SET', marker_prefix .. record_id, entry_id, 'NX', 'EX', marker_ttl) then
      if holds_lock then
        redis.call('DEL', lock_prefix .. record_id)
        release = false
      end
      if has_output and n > 0 then
        redis.call('XADD', output, '*', unpack(ARGV, first, last))
      end
    else
      duplicate = 1
    end
    acked[#acked + 1] = entry_id
  elseif action == 'D' then
    redis.call('XADD', dlq, '*', unpack(ARGV, first, last))
    acked[#acked + 1] = entry_id
  elseif action == 'R' then
    redis.call('ZADD', retry_set, server_now_ms() + tonumber(ARGV[first]), ARGV[first + 1])
    acked[#acked + 1] = entry_id
  end
  if release then
    local lock = lock_prefix .. record_id
    if redis.call('GET', lock) == token then
      redis.call('DEL', lock)
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
