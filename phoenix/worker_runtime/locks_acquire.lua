-- Claim a batch of records for processing, one round trip for the whole batch, one call per record.
-- Each record's key is taken with SET NX GET: absent, it now holds our lock; holding a marker (a value starting
-- with done_prefix), the record is processed already, so the marker's TTL is refreshed (1: the worker has the
-- entry acknowledged by its settler); holding another worker's lock, it is left alone (2); a key of another type
-- (written by something else than the runtime) can hold neither (3: the worker dead-letters that entry alone, where
-- an error would fail the whole read, again at every read).
-- Only the keys travel, no entry ids: Lua makes a string of every argument, and this runs once per message.
-- KEYS: the records' keys (record_prefix .. record_id).
-- ARGV: lock_value (our lock: 'lock ' .. token), lock_ttl_seconds, marker_ttl_seconds, done_prefix.
-- Returns position (from 1), code pairs for the records not acquired only: usually none.
local lock_value, lock_ttl, marker_ttl, done_prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local done_len = #done_prefix
local refused, n = {}, 0
for position = 1, #KEYS do
  local key = KEYS[position]
  local old = redis.pcall('SET', key, lock_value, 'NX', 'GET', 'EX', lock_ttl)
  if type(old) == 'table' and old.err then
    refused[n + 1], refused[n + 2] = position, 3
    n = n + 2
  elseif old then
    local code = 2
    if string.sub(old, 1, done_len) == done_prefix then
      redis.call('EXPIRE', key, marker_ttl)
      code = 1
    end
    refused[n + 1], refused[n + 2] = position, code
    n = n + 2
  end
end
return refused
