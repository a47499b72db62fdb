-- Release the single-fetch guard of a user's API key only if this worker still owns it: once the guard
-- expired, another worker may hold it, and deleting theirs would let a third worker call billing too.
-- KEYS[1] fetching_key:{user_id}
-- ARGV[1] the owner token written with SET NX EX. Returns 1 if released, 0 if no longer ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
