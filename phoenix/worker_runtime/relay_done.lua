-- The relay's last step for outbox entries it has written to their streams (relay.py): acknowledge and delete
-- them together, so an entry is either still pending in the outbox (relayed again after a crash: the downstream
-- stage's record markers, or the entry's relay marker for a plain stream, absorb the repeat) or gone, never
-- acknowledged and left behind unread.
-- KEYS: the lane's outbox stream.
-- ARGV: the relay's consumer group, then the entry ids.
-- Returns how many entries were deleted.
local outbox, group = KEYS[1], ARGV[1]
local deleted = 0
-- Chunked to stay far below Lua's limit on unpacked values.
for j = 2, #ARGV, 4000 do
  local last = math.min(j + 3999, #ARGV)
  redis.call('XACK', outbox, group, unpack(ARGV, j, last))
  deleted = deleted + redis.call('XDEL', outbox, unpack(ARGV, j, last))
end
return deleted
