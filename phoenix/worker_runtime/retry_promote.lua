-- Move messages whose retry is due from the retry set back into the input stream, atomically:
-- a message is in exactly one of the two at any time. Members are JSON arrays of field/value pairs.
-- KEYS[1] retry zset, KEYS[2] input stream. ARGV[1] batch limit. The XADD never trims (see trim.lua).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms, 'LIMIT', 0, tonumber(ARGV[1]))
for _, member in ipairs(due) do
  redis.call('XADD', KEYS[2], '*', unpack(cjson.decode(member)))
  redis.call('ZREM', KEYS[1], member)
end
return #due
