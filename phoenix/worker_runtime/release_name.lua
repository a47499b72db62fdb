-- A stage stops using a stream it claimed by name (ownership.release_names): its field goes from the name marker,
-- and the marker with the namespace's last stage, which frees the name. One key: the name marker.
-- KEYS[1] the stream's name marker.
-- ARGV[1] the stage's namespace; ARGV[2] the stage's name; ARGV[3] its Kubernetes cluster ('': unknown).
-- Returns how many stages of the namespace still use the name (0: the marker deleted), or -1 when the marker names
--   another namespace or cluster (nothing done).
local namespace, cluster = unpack(redis.call('HMGET', KEYS[1], 'namespace', 'cluster'))
if namespace ~= ARGV[1] then return -1 end
if cluster and cluster ~= '' and ARGV[3] ~= '' and cluster ~= ARGV[3] then return -1 end
redis.call('HDEL', KEYS[1], 'stage:' .. ARGV[2])
local users = 0
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(field, 1, 6) == 'stage:' then users = users + 1 end
end
if users == 0 then redis.call('DEL', KEYS[1]) end
return users
