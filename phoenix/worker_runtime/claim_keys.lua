-- Claim a stage's keys for one PhoenixStage and create what is missing, checked and written in one step
-- (ownership.py has the marker's fields and the rules). Nothing is written unless the claim succeeds.
-- KEYS[1] the stage's owner hash, KEYS[2] its input stream, KEYS[3] its DLQ stream, KEYS[4..] the owner hashes of
--   the other stages whose default input or DLQ name KEYS[2] or KEYS[3] is (StageKeys.holder_markers).
-- ARGV[1] the stage, "<namespace>/<name>"; ARGV[2] its uid; ARGV[3] its consumer group; ARGV[4] '1': a marker of
--   this stage with another uid is adopted (the operator), '0': refused (a worker: only the holder's own run);
--   ARGV[5] its Kubernetes cluster ('': unknown; a marker's cluster is then neither checked nor changed).
-- Returns {'refused', holder} (holder: "<namespace>/<name>", with its uid when only the uid differs, with its
--   cluster when that differs; '' for a consumer group on the input with no marker), {'wrongtype', key, type}, or
--   {'claimed', adopted (0/1), the earlier uid, group created (0/1), dlq created (0/1)}.
local owner, input, dlq = KEYS[1], KEYS[2], KEYS[3]
local stage, uid, group, adopt, cluster = ARGV[1], ARGV[2], ARGV[3], ARGV[4] == '1', ARGV[5]

for i = 4, #KEYS do
  local holder = redis.call('HGET', KEYS[i], 'stage')
  if holder and holder ~= stage then return {'refused', holder} end
end
-- HMGET gives false for a missing field.
local held, held_uid, held_input, held_group, held_dlq, held_created, held_cluster =
  unpack(redis.call('HMGET', owner, 'stage', 'uid', 'input', 'group', 'dlq', 'created', 'cluster'))
if held and held ~= stage then return {'refused', held} end
-- The same namespace and name in another Kubernetes cluster sharing this Redis: never adopted.
if held and cluster ~= '' and held_cluster and held_cluster ~= '' and held_cluster ~= cluster then
  return {'refused', held .. ' of Kubernetes cluster ' .. held_cluster}
end
local mine = held ~= false
held_uid = held_uid or ''
if mine and held_uid ~= uid and not adopt then
  if held_uid == '' then return {'refused', held .. ' (moved by phoenix migrate, not adopted by its PhoenixStage yet)'} end
  return {'refused', held .. ' (uid ' .. held_uid .. ')'}
end
for _, key in ipairs({input, dlq}) do
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'none' and kind ~= 'stream' then return {'wrongtype', key, kind} end
end

local created = {}
if mine then
  -- No `created` field: phoenix migrate wrote the marker, and what it moved is the stage's own.
  for word in string.gmatch(held_created or 'input,dlq,group', '[^,]+') do created[word] = true end
end
-- What the marker says was created holds for the names it recorded; a spec naming other streams starts anew.
local same_input = mine and (not held_input or held_input == input) and (not held_group or held_group == group)
if not same_input then created['input'], created['group'] = nil, nil end
if held_dlq and held_dlq ~= dlq then created['dlq'] = nil end

local groups = {}
if redis.call('EXISTS', input) == 1 then
  for _, info in ipairs(redis.call('XINFO', 'GROUPS', input)) do
    for j = 1, #info, 2 do
      if info[j] == 'name' then groups[info[j + 1]] = true end
    end
  end
end
local group_created = 0
if groups[group] then
  -- A group on the input that no marker of this stage accounts for: a worker run by hand, or data moved there.
  if not same_input then return {'refused', ''} end
else
  -- A stream no group reads yet (entries enqueued before the stage existed) becomes the stage's own.
  if next(groups) == nil then created['input'] = true end
  -- From 0: entries enqueued before the stage existed are processed too.
  redis.call('XGROUP', 'CREATE', input, group, '0', 'MKSTREAM')
  created['group'] = true
  group_created = 1
end
local dlq_created = 0
if redis.call('EXISTS', dlq) == 0 then
  -- An existing, empty stream, so that XLEN and XRANGE work before anything was dead-lettered.
  local id = redis.call('XADD', dlq, '*', 'created', 'phoenix')
  redis.call('XDEL', dlq, id)
  created['dlq'] = true
  dlq_created = 1
end

local words = {}
for _, word in ipairs({'input', 'dlq', 'group'}) do
  if created[word] then words[#words + 1] = word end
end
redis.call('HSET', owner, 'stage', stage, 'uid', uid, 'input', input, 'dlq', dlq, 'group', group,
  'created', table.concat(words, ','))
-- A marker without a cluster (written before clusters were kept) is taken by the first cluster that claims it.
if cluster ~= '' then redis.call('HSET', owner, 'cluster', cluster) end
local adopted = 0
if mine and held_uid ~= uid then adopted = 1 end
return {'claimed', adopted, held_uid, group_created, dlq_created}
