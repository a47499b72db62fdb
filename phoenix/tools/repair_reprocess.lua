-- Process a record again: delete its idempotency marker and add an entry for it to the input stream in one step,
-- refused while the record is locked (being processed). A source entry taken from the DLQ leaves the DLQ.
-- KEYS[1] the record's key, KEYS[2] input stream, KEYS[3] dlq stream
-- ARGV[1] done_prefix (a marker's value starts with it; anything else is a lock),
-- ARGV[2] id of the DLQ entry to delete ('' when the fields come from the input stream), then field/value pairs.
-- Returns {'locked', ''} or {'added', new_id, marker_deleted (0/1)}.
-- The pairs are unpacked into one XADD (Lua 5.1 stops near 8,000 values): repair.plan_reprocess refuses entries
-- wider than SCRIPT_SAFE_FIELDS before they get here.
local state = redis.call('GET', KEYS[1])
if state and string.sub(state, 1, #ARGV[1]) ~= ARGV[1] then
  return {'locked', ''}
end
local deleted = redis.call('DEL', KEYS[1])
local new_id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
if ARGV[2] ~= '' then
  redis.call('XDEL', KEYS[3], ARGV[2])
end
return {'added', new_id, deleted}
