-- Add a final stage's end-to-end latencies counted since its worker's last flush to the window's hash, and keep the
-- hash for as long as the operator reads the window back: one call per flush, whatever the records.
-- KEYS: the window's hash (keys.StageKeys.latency_window).
-- ARGV: the seconds the hash is kept from now, then pairs of a bucket's upper bound (the field, `0.5`, `+Inf`) and
-- the observations to add to it.
-- Returns the number of buckets added to.
local window, keep = KEYS[1], ARGV[1]
for i = 2, #ARGV, 2 do
  redis.call('HINCRBY', window, ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', window, keep)
return (#ARGV - 1) / 2
