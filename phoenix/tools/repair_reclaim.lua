-- Put the entries of dead consumers back to work now, instead of at a worker's next reclaim pass: each candidate
-- still pending and idle for at least min_idle_ms gets a copy (original_id kept) added to the input stream, the
-- old entry is acknowledged, and the record's lock is released if it still holds the dead consumer's token.
-- Entries of a consumer still alive (idle in the group below alive_within_ms, CLAIM_IDLE_MS: as unlock tells it) are
-- left to it: it may be processing them, and its lock is then no dead worker's.
-- Entries delivered max_deliveries times are left pending: the worker's reclaim dead-letters them as poison.
-- So are entries of more values than one unpack can give (Lua 5.1 stops near 8,000): no XADD can copy them, and
-- the worker's reclaim dead-letters them, packed, as over MAX_ENTRY_FIELDS.
-- KEYS[1] input stream, then the candidates' record keys (record_prefix .. record_id), in candidate order:
--   KEYS[1 + n] is candidate n's.
-- ARGV: group, min_idle_ms, max_deliveries, most values unpacked, alive_within_ms, then per candidate: entry_id,
--       lock_value (the record key's value while the dead consumer holds its lock; '' when it holds none).
-- Returns per candidate {status, new_id, lock_released (0/1)}; status 'moved', 'busy' (no longer pending, or
-- touched since the caller looked), 'alive' (its consumer is), 'poison' or 'wide' (left for the worker) or
-- 'trimmed' (gone from the stream: acknowledged).
local group, min_idle, max_deliveries = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local max_values, alive_within = tonumber(ARGV[4]), tonumber(ARGV[5])
-- The group's consumers idle below alive_within, read once for the call.
local alive = {}
for _, consumer in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], group)) do
  local info = {}
  for j = 1, #consumer, 2 do
    info[consumer[j]] = consumer[j + 1]
  end
  if tonumber(info['idle']) < alive_within then
    alive[info['name']] = true
  end
end
local result = {}
for i = 6, #ARGV, 2 do
  local entry_id, lock_value = ARGV[i], ARGV[i + 1]
  local record_key = KEYS[2 + #result]  -- every branch below adds one result per candidate
  local pending = redis.call('XPENDING', KEYS[1], group, 'IDLE', min_idle, entry_id, entry_id, 1)
  if #pending == 0 then
    result[#result + 1] = {'busy', '', 0}
  elseif alive[pending[1][2]] then
    result[#result + 1] = {'alive', '', 0}
  elseif tonumber(pending[1][4]) >= max_deliveries then
    result[#result + 1] = {'poison', '', 0}
  else
    local entries = redis.call('XRANGE', KEYS[1], entry_id, entry_id)
    if #entries == 0 then
      redis.call('XACK', KEYS[1], group, entry_id)
      result[#result + 1] = {'trimmed', '', 0}
    elseif #entries[1][2] + 2 > max_values then
      result[#result + 1] = {'wide', '', 0}
    else
      redis.call('XACK', KEYS[1], group, entry_id)
      local fields, has_original = entries[1][2], false
      for j = 1, #fields, 2 do
        if fields[j] == 'original_id' then has_original = true end
      end
      if not has_original then
        fields[#fields + 1] = 'original_id'
        fields[#fields + 1] = entry_id
      end
      local new_id = redis.call('XADD', KEYS[1], '*', unpack(fields))
      local released = 0
      if lock_value ~= '' and redis.call('GET', record_key) == lock_value then
        redis.call('DEL', record_key)
        released = 1
      end
      result[#result + 1] = {'moved', new_id, released}
    end
  end
end
return result
