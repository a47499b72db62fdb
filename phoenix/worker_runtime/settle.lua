-- Settle a batch of messages atomically, one round trip for the batch. Per item, by its code:
--   C commit:  the record's key becomes its idempotency marker (SET GET: whatever lock it held, ours or one
--              taken after ours expired, is replaced), the result is XADDed to the output stream (record_id,
--              user_id, data, entered_at, and deadline unless empty), then XACK. If the key held a marker already, another message committed the record
--              first: its marker is put back and nothing is forwarded (a duplicate). Marker, forward and
--              acknowledgement happen together or not at all, so a crash can neither lose the record for the next
--              stage nor forward it twice; a later claim finds the marker.
--   T          a commit whose forward also carries a traceparent; M a commit that forwards nothing (no output
--              stream, or the processor returned None).
--   F          a commit of a stage of named outputs, forwarding to one or more of them (processor.Routed): each
--              forward an XADD to its output's stream (KEYS[4 + n]), with the output's name (route_field) when
--              that stream is the lane's outbox. A forward that fails deletes the ones of the item written before
--              it, so the item is all forwarded or not at all, as C's one XADD is.
--   D dead-letter: XADD the fields to the DLQ, XACK.
--   R retry:   ZADD the message (a JSON array of fields) to the retry set, due in delay_ms; XACK.
--   D and R are written only while their entry is pending, and acknowledged with their write: a batch sent again
--   after its reply was lost (a socket timeout after the script ran), or written again in halves after a script
--   error, finds them acknowledged and writes no second dead letter, nor a second retry (one the retry set has
--   promoted meanwhile would run twice). The entry is the guard an intake dead letter has too (it holds no lock).
--   Commits need no check of their own: a commit sent again finds its marker.
--   L leave:   nothing; the entry stays pending for a later attempt (circuit open, shutdown).
--   s skip:    XACK only: the claim found the record committed already (a duplicate; it took no lock).
-- D, R and L come in upper case when this worker holds the record's lock, which is then released if still ours
-- (compare-and-delete), in lower case when it took none (a malformed entry).
-- No XADD trims (MAXLEN cut unread entries): streams shrink through trim.lua, bounded by backpressure.
-- An error stops the script without undoing the items before it (settle.py then writes the batch again in halves
-- to find the item), so the order is chosen for that: commits first, a commit whose forward fails taking its
-- marker back (a commit written already is found by its marker and never forwarded twice; one not written is not
-- taken for a duplicate); then retries and dead letters, each acknowledged as it is written. A D item's fields are
-- unpacked into one XADD (Lua 5.1 stops near 8,000 values): settle.py sends a wider one packed.
-- KEYS: input stream, output stream (or the input when the stage has no output), dlq stream, retry zset, then
--       the stream of each named output (n_named of them, ARGV[10]; none for a stage of one output), then the
--       items' record keys (record_prefix .. record_id), one per item in item order: KEYS[4 + n_named + n] is
--       item n's.
--       Every key the script touches is declared (a Redis Cluster node checks them; they share one hash tag).
--       All are one lane's (a partition of the stage, lanes.py); the output stream is the lane's outbox when its
--       forwards are relayed (another slot, or a stream that depends on the record): written the same way.
-- ARGV: group, lock_value (our lock: 'lock ' .. token), marker_ttl, done_prefix, the forwarded entry's field
--       names (record_id, user_id, data, entered_at, deadline, traceparent), route_field, n_named, then per named
--       output its name when its stream is the outbox, else '' (n_named values), then the items, each code
--       entry_id record_id and by code: C user_id data entered_at deadline | T user_id data entered_at deadline
--       traceparent | M - | F user_id entered_at deadline traceparent ('' for none) count (output n, from 1;
--       data)... | D field_count fields... | R delay_ms member | L - | s -; an empty deadline: the record has none.
--       Fixed layouts keep names and counts out of the commits: Lua makes a string of every argument, and
--       commits are most items.
-- Returns the positions (from 1) of the commits that found their record committed already: the duplicates.
local input, output, dlq, retry_set = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, lock_value, marker_ttl, done_prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local record_field, user_field, data_field = ARGV[5], ARGV[6], ARGV[7]
local entered_field, deadline_field, trace_field = ARGV[8], ARGV[9], ARGV[10]
local route_field, n_named = ARGV[11], tonumber(ARGV[12])
local relayed_as = {}  -- per named output: its name when its forwards go to the outbox, else ''
for n = 1, n_named do
  relayed_as[n] = ARGV[12 + n]
end
local done_len = #done_prefix
local width = {C = 7, T = 8, M = 3, R = 5, r = 5, L = 3, l = 3, s = 3}  -- D and d: 4 + field_count; F: 8 + 2 count

local now_ms
local function server_now_ms()
  if not now_ms then
    local t = redis.call('TIME')
    now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now_ms
end

local duplicates, acked, n_acked, item, i, argc = {}, {}, 0, 0, 13 + n_named, #ARGV
local first_record = 4 + n_named  -- KEYS[first_record + n] is item n's record key
-- Positions in ARGV of the R and D items, written after the commits, and their item numbers.
local retries, retry_items, dead, dead_items = {}, {}, {}, {}
local function release(code, n)
  if code == 'D' or code == 'R' or code == 'L' then
    local key = KEYS[first_record + n]
    if redis.call('GET', key) == lock_value then
      redis.call('DEL', key)
    end
  end
end
while i <= argc do
  local code, entry_id, record_id = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  item = item + 1
  local key = KEYS[first_record + item]
  if code == 'C' or code == 'T' or code == 'M' or code == 'F' then
    local old = redis.call('SET', key, done_prefix .. entry_id, 'GET', 'EX', marker_ttl)
    if old and old ~= lock_value and string.sub(old, 1, done_len) == done_prefix then
      redis.call('SET', key, old, 'EX', marker_ttl)
      duplicates[#duplicates + 1] = item
    elseif code ~= 'M' then
      local forwarded
      if code == 'C' and ARGV[i + 6] == '' then
        -- Most commits: their fields passed as they are, without the table and unpack of the other forwards (a
        -- table a commit cost a tenth of the script's time per record: docs/performance.md, round three).
        forwarded = redis.pcall('XADD', output, '*', record_field, record_id, user_field, ARGV[i + 3], data_field,
          ARGV[i + 4], entered_field, ARGV[i + 5])
      elseif code == 'C' or code == 'T' then
        local entry = {record_field, record_id, user_field, ARGV[i + 3], data_field, ARGV[i + 4], entered_field,
          ARGV[i + 5]}
        if ARGV[i + 6] ~= '' then
          entry[9], entry[10] = deadline_field, ARGV[i + 6]
        end
        if code == 'T' then
          entry[#entry + 1], entry[#entry + 2] = trace_field, ARGV[i + 7]
        end
        forwarded = redis.pcall('XADD', output, '*', unpack(entry))
      else
        local written = {}
        for f = 1, tonumber(ARGV[i + 7]) do
          local at = i + 6 + 2 * f
          local n = tonumber(ARGV[at])
          local fields = {record_field, record_id, user_field, ARGV[i + 3], data_field, ARGV[at + 1], entered_field,
            ARGV[i + 4]}
          if ARGV[i + 5] ~= '' then
            fields[#fields + 1], fields[#fields + 2] = deadline_field, ARGV[i + 5]
          end
          if ARGV[i + 6] ~= '' then
            fields[#fields + 1], fields[#fields + 2] = trace_field, ARGV[i + 6]
          end
          if relayed_as[n] ~= '' then
            fields[#fields + 1], fields[#fields + 2] = route_field, relayed_as[n]
          end
          forwarded = redis.pcall('XADD', KEYS[4 + n], '*', unpack(fields))
          if type(forwarded) == 'table' and forwarded.err then
            for _, w in ipairs(written) do
              local written_n, written_id = w[1], w[2]
              redis.call('XDEL', KEYS[4 + written_n], written_id)
            end
            break
          end
          written[#written + 1] = {n, forwarded}
        end
      end
      if type(forwarded) == 'table' and forwarded.err then
        -- Not forwarded: take the marker back, or the batch written again would take the record for a duplicate.
        if old then
          redis.call('SET', key, old, 'KEEPTTL')
        else
          redis.call('DEL', key)
        end
        return redis.error_reply(forwarded.err)
      end
    end
    n_acked = n_acked + 1
    acked[n_acked] = entry_id
  elseif code == 'R' or code == 'r' then
    retry_items[#retries + 1] = item
    retries[#retries + 1] = i
  elseif code == 'D' or code == 'd' then
    dead_items[#dead + 1] = item
    dead[#dead + 1] = i
  else
    if code == 's' then
      n_acked = n_acked + 1
      acked[n_acked] = entry_id
    end
    release(code, item)
  end
  if code == 'F' then
    i = i + 8 + 2 * tonumber(ARGV[i + 7])
  else
    i = i + (width[code] or 4 + tonumber(ARGV[i + 3]))
  end
end
-- Retries, then dead letters: each written only while its entry is pending, and acknowledged at once.
local function pending(entry_id)
  return #redis.call('XPENDING', input, group, entry_id, entry_id, 1) > 0
end
for r, j in ipairs(retries) do
  if pending(ARGV[j + 1]) then
    redis.call('ZADD', retry_set, server_now_ms() + tonumber(ARGV[j + 3]), ARGV[j + 4])
    redis.call('XACK', input, group, ARGV[j + 1])
  end
  release(ARGV[j], retry_items[r])
end
for d, j in ipairs(dead) do
  if pending(ARGV[j + 1]) then
    redis.call('XADD', dlq, '*', unpack(ARGV, j + 4, j + 3 + tonumber(ARGV[j + 3])))
    redis.call('XACK', input, group, ARGV[j + 1])
  end
  release(ARGV[j], dead_items[d])
end
-- One XACK for the batch; chunked to stay far below Lua's limit on unpacked values.
for j = 1, n_acked, 4000 do
  redis.call('XACK', input, group, unpack(acked, j, math.min(j + 3999, n_acked)))
end
return duplicates
