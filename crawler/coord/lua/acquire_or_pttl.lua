-- ACQUIRE_OR_PTTL: takes a gate if it is open (SET NX PX), else says how long until it opens.
--
-- KEYS[1] = the gate (keys.gate, or any lock key); KEYS[2] = a hash whose ``pace_ms`` field
--   lengthens the lifetime (the site's conf, keys.conf), absent for a fixed interval.
-- ARGV[1] = token, ARGV[2] = lifetime in ms, ARGV[3] = ms added to the pace (with KEYS[2]).
-- Returns 0 when the gate was taken, else its remaining PTTL in ms (at least 1).
--
-- Cluster: one slot, but for a site whose requests take a shared gate (Spider.gate, gate_by =
-- "ip": a slot of its own) with an adaptive interval: then KEYS[1] and KEYS[2] are cross-slot.
--@include _lifetime.lua
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', lifetime()) then
    return 0
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 1 then ttl = 1 end
return ttl
