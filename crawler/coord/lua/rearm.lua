-- REARM: restarts a held gate's lifetime from now if the token holds it, or takes it if nobody does.
--
-- KEYS[1] = the gate (keys.gate, or any lock key); KEYS[2] = a hash whose ``pace_ms`` field
--   lengthens the lifetime (the site's conf, keys.conf), absent for a fixed interval.
-- ARGV[1] = token, ARGV[2] = lifetime in ms from now, ARGV[3] = ms added to the pace (with KEYS[2]).
-- Returns 1 (restarted), 2 (taken again after it had expired), 0 (someone else holds it).
--
-- Cluster: one slot, but for a site whose requests take a shared gate with an adaptive
-- interval (as ACQUIRE_OR_PTTL).
--@include _lifetime.lua
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], lifetime())
    return 1
end
if not holder then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', lifetime())
    return 2
end
return 0
