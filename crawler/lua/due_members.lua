-- DUE_MEMBERS: the members of a waiting set that are due by the Redis clock, oldest first: the
-- retries (keys.delayed) or refreshes (keys.recrawls) that PROMOTE_DUE then moves. Reads only.
--
-- KEYS[1] = the set (members scored by when they are due, ms on the Redis clock).
-- ARGV[1] = most members returned.
-- Returns the due members.
--
-- Cluster: one key.
--@include _now.lua
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms(), 'LIMIT', 0, tonumber(ARGV[1]))
