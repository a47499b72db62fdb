-- Check a stage's layout (its partition count) against the count a worker or the operator runs it with, and write
-- it when the stage has none yet (ownership.check_layout). One key slot: the layout and the stage's one-partition
-- input stream are both under the stage-wide tag.
-- KEYS[1] the stage's layout hash, KEYS[2] the input stream the stage has with one partition.
-- ARGV[1] the partitions asked for.
-- Returns {'ok'} or {'differs', the partitions of the layout}. No layout means one partition, so a stage of one
--   gets none written (its keys stay today's, and a stage refused its keys leaves nothing behind); a stage with no
--   layout whose one-partition input exists holds its records there: one partition.
local have = redis.call('HGET', KEYS[1], 'partitions')
if have then
  if have == ARGV[1] then return {'ok'} end
  return {'differs', have}
end
if ARGV[1] == '1' then return {'ok'} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {'differs', '1'} end
redis.call('HSET', KEYS[1], 'partitions', ARGV[1])
return {'ok'}
