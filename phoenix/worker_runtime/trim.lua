-- Trim what is finished, never what is not: the input stream loses only entries every consumer group on it has
-- acknowledged, and the DLQ, only when DLQ_MAXLEN bounds it, loses its oldest entries with a count kept.
-- For each group the oldest entry it still needs is its oldest pending entry, or, with nothing pending, its
-- last delivered id (kept itself: XTRIM MINID removes only smaller ids). Entries after that are unread.
-- A stream without any group is left alone: nobody has read anything of it. The one exception is the stage's
-- own output while no group reads it (a sink read with XREAD, or by nobody): nothing will ever acknowledge its
-- entries, so it keeps what OUTPUT_RETENTION chooses, the newest entries or those younger than an age, if set.
-- KEYS: input stream, dlq stream, dlq trimmed counter[, output stream (absent: a final stage)].
-- ARGV: dlq maxlen (0: unbounded), retention kind ('maxlen', 'age' or '': none), its amount (entries, or ms).
-- Returns {entries trimmed from the input, from the dlq, 1 if no group reads the output (else 0), entries
-- trimmed from the output}.
local input, dlq, dlq_counter, output = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local dlq_maxlen, retention, amount = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])

local function id_before(a, b)
  local a_ms, a_seq = string.match(a, '^(%d+)-(%d+)$')
  local b_ms, b_seq = string.match(b, '^(%d+)-(%d+)$')
  a_ms, b_ms = tonumber(a_ms), tonumber(b_ms)
  return a_ms < b_ms or (a_ms == b_ms and tonumber(a_seq) < tonumber(b_seq))
end

local input_trimmed = 0
if redis.call('TYPE', input)['ok'] == 'stream' then
  local keep_from
  for _, group in ipairs(redis.call('XINFO', 'GROUPS', input)) do
    local info = {}
    for j = 1, #group, 2 do
      info[group[j]] = group[j + 1]
    end
    local needed = info['last-delivered-id']
    if tonumber(info['pending']) > 0 then
      needed = redis.call('XPENDING', input, info['name'])[2]
    end
    if keep_from == nil or id_before(needed, keep_from) then
      keep_from = needed
    end
  end
  if keep_from ~= nil then
    input_trimmed = redis.call('XTRIM', input, 'MINID', keep_from)
  end
end

local dlq_trimmed = 0
if dlq_maxlen > 0 and redis.call('TYPE', dlq)['ok'] == 'stream' and redis.call('XLEN', dlq) > dlq_maxlen then
  dlq_trimmed = redis.call('XTRIM', dlq, 'MAXLEN', dlq_maxlen)
  redis.call('INCRBY', dlq_counter, dlq_trimmed)
end

local output_unread, output_trimmed = 0, 0
if output ~= nil then
  local output_type = redis.call('TYPE', output)['ok']
  -- A missing stream has no group either: the stage's next XADD creates it without one.
  if output_type == 'none' or (output_type == 'stream' and #redis.call('XINFO', 'GROUPS', output) == 0) then
    output_unread = 1
  end
  if output_unread == 1 and output_type == 'stream' then
    if retention == 'maxlen' then
      output_trimmed = redis.call('XTRIM', output, 'MAXLEN', amount)
    elseif retention == 'age' then
      -- Entry ids start with the server's milliseconds, so the server's clock decides what is old.
      local now = redis.call('TIME')
      local cutoff = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - amount
      if cutoff > 0 then
        output_trimmed = redis.call('XTRIM', output, 'MINID', string.format('%d', cutoff))
      end
    end
  end
end
return {input_trimmed, dlq_trimmed, output_unread, output_trimmed}
