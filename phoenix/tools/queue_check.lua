-- A stage's input figures and the entry ids they are checked against, in one atomic look (tools/queue_stats.py):
-- XINFO's lag and XPENDING's oldest entry go wrong after XDEL and XTRIM, the ids do not, and a worker acting between
-- two separate reads would make them disagree where nothing is wrong.
-- KEYS: the input stream.
-- ARGV: the consumer group; the most pending entries missing from the stream to count.
-- Returns {length, lag (-1: Redis reports null), the first entry's id, the first undelivered entry's id, pending
-- entries, the oldest pending entry still in the stream (at or after the first entry), pending entries older than
-- the first entry (gone from the stream; at most ARGV[2])}, an id '' where there is none; {} without the stream or
-- the group.
local stream, group, most = KEYS[1], ARGV[1], tonumber(ARGV[2])
if redis.call('TYPE', stream)['ok'] ~= 'stream' then
  return {}
end
local info
for _, found in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local fields = {}
  for j = 1, #found, 2 do
    fields[found[j]] = found[j + 1]
  end
  if fields['name'] == group then
    info = fields
  end
end
if info == nil then
  return {}
end

local function first_id(entries)
  if #entries > 0 then
    return entries[1][1]
  end
  return ''
end

local head = first_id(redis.call('XRANGE', stream, '-', '+', 'COUNT', 1))
local undelivered = first_id(redis.call('XRANGE', stream, '(' .. info['last-delivered-id'], '+', 'COUNT', 1))
local pending = tonumber(info['pending'])
local oldest, gone = '', 0
if pending > 0 and head == '' then
  gone = math.min(pending, most)
elseif pending > 0 then
  oldest = first_id(redis.call('XPENDING', stream, group, head, '+', 1))
  gone = #redis.call('XPENDING', stream, group, '-', '(' .. head, most)
end
return {redis.call('XLEN', stream), info['lag'] or -1, head, undelivered, pending, oldest, gone}
