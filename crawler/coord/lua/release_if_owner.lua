-- RELEASE_IF_OWNER: deletes a lock only if the token still holds it.
--
-- KEYS[1] = the lock (keys.gate, or any lock key).
-- ARGV[1] = token.
-- Returns 1 if it deleted the lock, else 0.
--
-- Cluster: one key.
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
