-- DUE_MEMBERS: the members of waiting sets that are due by the Redis clock, oldest first: the
-- retries (keys.delayed) and refreshes (keys.recrawls) that PROMOTE_DUE then moves. Reads only.
--
-- KEYS[1] = a set of members scored by when they are due (ms on the Redis clock), KEYS[2..] more
--   such sets.
-- ARGV[1] = most members returned per set.
-- Returns a list per set in KEYS, in their order: its due members.
--
-- Cluster: cross-slot: the retries and the refreshes sets are global keys without a hash tag,
-- each in a slot of its own (one call for both keeps an idle look at one round trip).
--@include _now.lua
local now, found = now_ms(), {}
for i = 1, #KEYS do
    found[i] = redis.call('ZRANGEBYSCORE', KEYS[i], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
end
return found
