-- Release a record's lock by hand, refusing while its holder is alive: the check and the delete are one step, so
-- a lock re-taken meanwhile (another token) or a holder that woke up is never released by mistake.
-- A holder is alive while its consumer's idle time in the group is below alive_within_ms (CLAIM_IDLE_MS).
-- KEYS[1] the record's key, KEYS[2] input stream
-- ARGV: the lock value seen by the caller ('lock ' .. token), holder consumer name, group, alive_within_ms,
--       force ('1' releases regardless)
-- Returns {status, holder_idle_ms}: status 'released', 'changed' (gone or re-taken) or 'alive' (refused);
-- holder_idle_ms is -1 when the holder is not in the group.
local lock_value, holder, group, alive_within, force = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5] == '1'
if redis.call('GET', KEYS[1]) ~= lock_value then
  return {'changed', -1}
end
local idle = -1
local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', KEYS[2], group)
if ok then
  for _, consumer in ipairs(consumers) do
    local info = {}
    for i = 1, #consumer, 2 do
      info[consumer[i]] = consumer[i + 1]
    end
    if info['name'] == holder then
      idle = tonumber(info['idle'])
    end
  end
end
if idle >= 0 and idle < alive_within and not force then
  return {'alive', idle}
end
redis.call('DEL', KEYS[1])
return {'released', idle}
