-- Move messages whose retry is due from the retry set back into the input stream, atomically:
-- a message is in exactly one of the two at any time. Members are JSON arrays of field/value pairs.
-- A member of more values than one unpack can give (Lua 5.1 stops near 8,000; written before MAX_ENTRY_FIELDS, or
-- by hand) cannot become an XADD's arguments: it goes back packed, as its record_id and the member itself in the
-- packed field, so the worker dead-letters it with the reason instead of every promotion failing on it forever.
-- KEYS[1] retry zset, KEYS[2] input stream. ARGV[1] batch limit, ARGV[2] most values unpacked, ARGV[3] the packed
-- field's name. The XADD never trims (see trim.lua).
local max_values, packed_field = tonumber(ARGV[2]), ARGV[3]
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms, 'LIMIT', 0, tonumber(ARGV[1]))
for _, member in ipairs(due) do
  local fields = cjson.decode(member)
  if #fields <= max_values then
    redis.call('XADD', KEYS[2], '*', unpack(fields))
  else
    local packed = {}
    for j = 1, #fields - 1, 2 do
      if fields[j] == 'record_id' then
        packed = {'record_id', fields[j + 1]}
        break
      end
    end
    packed[#packed + 1] = packed_field
    packed[#packed + 1] = member
    redis.call('XADD', KEYS[2], '*', unpack(packed))
  end
  redis.call('ZREM', KEYS[1], member)
end
return #due
