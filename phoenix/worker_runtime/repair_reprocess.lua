-- Process a record again: delete its idempotency marker and add an entry for it to the input stream in one step,
-- refused while the record is locked (being processed). A source entry taken from the DLQ leaves the DLQ.
-- KEYS[1] marker, KEYS[2] lock, KEYS[3] input stream, KEYS[4] dlq stream
-- ARGV[1] id of the DLQ entry to delete ('' when the fields come from the input stream), then field/value pairs.
-- Returns {'locked', ''} or {'added', new_id, marker_deleted (0/1)}.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'locked', ''}
end
local deleted = redis.call('DEL', KEYS[1])
local new_id = redis.call('XADD', KEYS[3], '*', unpack(ARGV, 2))
if ARGV[1] ~= '' then
  redis.call('XDEL', KEYS[4], ARGV[1])
end
return {'added', new_id, deleted}
