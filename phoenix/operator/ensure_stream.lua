-- Make KEYS[1] an existing, empty stream unless it already exists, so that XLEN and XRANGE on it work before
-- anything was dead-lettered: the placeholder entry is deleted at once, and an empty stream stays.
if redis.call('EXISTS', KEYS[1]) == 0 then
  local id = redis.call('XADD', KEYS[1], '*', 'created', 'phoenix-operator')
  redis.call('XDEL', KEYS[1], id)
  return 1
end
return 0
