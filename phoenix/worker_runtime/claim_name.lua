-- Claim a stream that a stage names itself (outside every namespace's scope) for the stage's namespace, checked and
-- written in one step (ownership.claim_names; keys.name_marker has the marker's place). One key: the name marker, in
-- the stream's slot.
-- KEYS[1] the stream's name marker.
-- ARGV[1] the stage's namespace; ARGV[2] its Kubernetes cluster ('': unknown, any is accepted and none written);
--   ARGV[3] the stage's name.
-- Returns {'claimed'}, or {'refused', holder} (the namespace holding it, with its cluster when that differs).
local namespace, cluster = unpack(redis.call('HMGET', KEYS[1], 'namespace', 'cluster'))
if namespace and namespace ~= ARGV[1] then return {'refused', namespace} end
if namespace and cluster and cluster ~= '' and ARGV[2] ~= '' and cluster ~= ARGV[2] then
  return {'refused', namespace .. ' of Kubernetes cluster ' .. cluster}
end
redis.call('HSET', KEYS[1], 'namespace', ARGV[1], 'stage:' .. ARGV[3], '1')
-- A marker without a cluster (written before clusters were kept) is taken by the first cluster that claims it.
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], 'cluster', ARGV[2]) end
return {'claimed'}
