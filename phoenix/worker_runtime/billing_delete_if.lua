-- Delete a key only if it still holds the value this worker saw, for two keys of a user:
-- the single-fetch guard (once it expired, another worker may hold it, and deleting theirs would let a third
-- worker call billing too) and the cached API key (a worker dropping a refused or unreadable entry must not
-- delete the new key another worker cached meanwhile).
-- KEYS[1] the guard or the cached key of a user (phoenix/keys.py: billing_guard_key, billing_cache_key)
-- ARGV[1] the value seen (the guard's owner token, or the cache entry). Returns 1 if deleted, 0 if it changed.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
