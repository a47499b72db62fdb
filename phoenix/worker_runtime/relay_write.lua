-- The relay's write of one outbox entry to a stream no Phoenix stage reads (relay.py): a stage's input has record
-- markers that absorb a repeat, such a stream has none, so the entry's relay marker records the write. An entry
-- relayed again (its relay killed before relay_done.lua) finds the marker and writes nothing.
-- The XADD comes before the marker: a script stopped between them (Redis keeps what a script wrote before an
-- error) leaves the entry without its marker, written again if relayed again, never the marker alone, which
-- would drop the entry for good.
-- KEYS: the target stream, then the entry's relay marker (StageKeys.relay_marker: in the target's slot).
-- ARGV: the marker's lifetime in ms, then the entry's field names and values.
-- Returns 1 when written, 0 when the marker says it was already.
local target, marker = KEYS[1], KEYS[2]
if redis.call('EXISTS', marker) == 1 then
  return 0
end
redis.call('XADD', target, '*', unpack(ARGV, 2))
redis.call('SET', marker, '1', 'PX', ARGV[1])
return 1
