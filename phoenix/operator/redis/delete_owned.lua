-- Delete keys of a stage that its PhoenixStage owns (redis_ops.destroy): nothing at all unless the ownership marker
-- still names that PhoenixStage's uid, and each key only while it has the type expected of it, so a key of another
-- type that took one of the stage's names is never deleted.
-- KEYS[1] the stage's owner hash; KEYS[2..] the keys.
-- ARGV[1] the uid the marker must hold; ARGV[2] a consumer group to destroy on KEYS[2] before anything is deleted
--   ('' for none); ARGV[3] '1': delete the marker too, last; ARGV[4..] the type each of KEYS[2..] must have to be
--   deleted ('-': not deleted, only named for the group; 'unread': a stream, deleted only while no consumer group
--   reads it, so another stage's group and the entries waiting for it stay).
-- Returns the number of keys deleted (the marker not counted; a destroyed group counts 1), or -1 when the marker
-- names another uid or is gone (nothing done).
if redis.call('HGET', KEYS[1], 'uid') ~= ARGV[1] then return -1 end
local deleted = 0
if ARGV[2] ~= '' and redis.call('TYPE', KEYS[2])['ok'] == 'stream' then
  for _, info in ipairs(redis.call('XINFO', 'GROUPS', KEYS[2])) do
    for j = 1, #info, 2 do
      if info[j] == 'name' and info[j + 1] == ARGV[2] then
        redis.call('XGROUP', 'DESTROY', KEYS[2], ARGV[2])
        deleted = deleted + 1
      end
    end
  end
end
for i = 2, #KEYS do
  local wanted, kind = ARGV[i + 2], redis.call('TYPE', KEYS[i])['ok']
  if wanted == 'unread' and kind == 'stream' and #redis.call('XINFO', 'GROUPS', KEYS[i]) == 0 then
    deleted = deleted + redis.call('DEL', KEYS[i])
  elseif wanted ~= '-' and wanted ~= 'unread' and kind == wanted then
    deleted = deleted + redis.call('DEL', KEYS[i])
  end
end
if ARGV[3] == '1' then redis.call('DEL', KEYS[1]) end
return deleted
