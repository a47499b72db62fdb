-- Add a record to a stage's input once per record id within a window: the producer's send_once (the HTTP ingest's
-- POST), so that a client retrying a request whose answer it lost adds no second entry.
-- KEYS[1] the record's ingest marker (StageKeys.ingest_marker), KEYS[2] the input stream of the record's partition:
--   both in one slot (the marker is named after the stream's hash tag).
-- ARGV[1] the marker's lifetime in seconds (the window), then the entry's fields and values, in pairs.
-- Returns {1, entry id} for a new entry, {0, the first entry's id} for a record id seen within the window.
local first = redis.call('GET', KEYS[1])
if first then
  return {0, first}
end
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 2))
redis.call('SET', KEYS[1], id, 'EX', ARGV[1])
return {1, id}
