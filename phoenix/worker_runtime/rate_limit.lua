-- Rate limits shared by every pod (GCRA: each bucket keeps its theoretical arrival time, `tat`, in ms of the
-- server's clock). One call per read batch: charges and pauses reported since the last call are applied first, then
-- the batch's records are placed in order, each needing one unit of every bucket it is under.
--   A records bucket has room at max(tat, now) + interval - capacity * interval; a tokens bucket the same, but its
--   tat moves only by what calls are charged afterwards (a later call's charge), so it may go into debt, which
--   holds its next records back. A pause (a provider's 429 Retry-After) moves the tat so that nothing has room for
--   pause_ms, then one unit.
--   A record whose buckets all have room within hold_ms is reserved: each records bucket's tat advances by one
--   interval, and the worker starts it when its time comes (the reply, 0 for now). A record further off takes
--   nothing: it is told to come back at its bucket's next free slot, one interval after the last slot given to a
--   record sent back by any pod (the bucket's horizon), so a held backlog comes back spread at the limit's rate,
--   not all at once.
-- A bucket's value: "<tat>,<horizon>" (ms).
-- The stage's held set counts what its limits hold back now (status.queue.throttled): each record sent back, and
-- each one a provider's 429 sent back (reported by the worker), by its record id, scored when it is due; what is
-- past is removed, and the set expires with its last record.
-- KEYS: the buckets of this call, each a rate limit's key (keys.rate_limit_key: all under the namespace's
--       own hash tag, one slot), each once; then the stage's held set (StageKeys.held, under that tag too).
-- ARGV: hold_ms, bucket count b; per bucket, in KEYS order: interval_ms, capacity, kind ('r' records | 't'
--       tokens), charge (units to charge now, 0 for none), pause_ms (0 for none); then the record count m and per
--       record: its id, its bucket count k and k bucket positions (from 1); then the count h of records a 429 sent
--       back and per one its id and the ms until it is due.
-- Returns per record: 0 to start now, w > 0 to start in w ms (reserved), -w to come back in w ms (not reserved).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local hold, b = tonumber(ARGV[1]), tonumber(ARGV[2])
local interval, tau, kind, tat, horizon, changed = {}, {}, {}, {}, {}, {}
for k = 1, b do
  local at = 3 + (k - 1) * 5
  interval[k] = tonumber(ARGV[at])
  tau[k] = tonumber(ARGV[at + 1]) * interval[k]
  kind[k] = ARGV[at + 2]
  local value = redis.call('GET', KEYS[k]) or ''
  local stored_tat, stored_horizon = string.match(value, '^([%d.]+),([%d.]+)$')
  tat[k], horizon[k] = tonumber(stored_tat) or 0, tonumber(stored_horizon) or 0
  local charge, pause = tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4])
  if charge > 0 then
    tat[k] = math.max(tat[k], now) + charge * interval[k]
    changed[k] = true
  end
  if pause > 0 then
    tat[k] = math.max(tat[k], now + pause + tau[k] - interval[k])
    changed[k] = true
  end
end
local i = 3 + b * 5
local m = tonumber(ARGV[i])
i = i + 1
local held = KEYS[b + 1]
local replies, added = {}, false
local function hold_back(id, due)
  redis.call('ZADD', held, due, id)
  added = true
end
for r = 1, m do
  local id, n = ARGV[i], tonumber(ARGV[i + 1])
  i = i + 1
  local wait = 0
  for j = i + 1, i + n do
    local k = tonumber(ARGV[j])
    wait = math.max(wait, math.max(tat[k], now) + interval[k] - tau[k] - now)
  end
  if wait <= hold then
    for j = i + 1, i + n do
      local k = tonumber(ARGV[j])
      if kind[k] == 'r' then
        tat[k] = math.max(tat[k], now) + interval[k]
        changed[k] = true
      end
    end
    replies[r] = math.ceil(wait)
  else
    local back = 0
    for j = i + 1, i + n do
      local k = tonumber(ARGV[j])
      local room = math.max(tat[k], now) + interval[k] - tau[k]
      if room - now > hold then
        horizon[k] = math.max(room, horizon[k] + interval[k])
        changed[k] = true
        back = math.max(back, horizon[k] - now)
      end
    end
    replies[r] = -math.max(1, math.ceil(back))
    hold_back(id, now - replies[r])
  end
  i = i + n + 1
end
for j = i + 1, i + 2 * tonumber(ARGV[i]), 2 do
  hold_back(ARGV[j], now + tonumber(ARGV[j + 1]))
end
redis.call('ZREMRANGEBYSCORE', held, '-inf', now)
if added then
  local last = redis.call('ZRANGE', held, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', held, math.ceil(tonumber(last[2])) + 1000)
end
for k = 1, b do
  if changed[k] then
    -- Past its tat (and a capacity's worth after it) and its horizon a bucket is as if new: the key can go.
    local ttl = math.max(1000, math.ceil(math.max(tat[k] + tau[k], horizon[k]) - now))
    redis.call('SET', KEYS[k], string.format('%.3f,%.3f', tat[k], horizon[k]), 'PX', ttl)
  end
end
return replies
