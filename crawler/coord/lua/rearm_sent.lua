-- REARM_SENT: ends a held gate's lifetime a given time from now, for a request sent earlier
-- (Gate.rearm_sent: its rearm went with the request's record, not at the send).
--
-- KEYS[1] = the gate (keys.gate).
-- ARGV[1] = token, ARGV[2] = ms left of the interval counted from the send (0 or less: over).
-- Returns 1 if the token held it (its lifetime now ends ARGV[2] ms from now, or it is deleted
-- when that is 0 or less), 0 if it had expired or someone else holds it (left as it is: never
-- taken again, since no request goes with this call).
--
-- Cluster: one key.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
local left = tonumber(ARGV[2])
if left > 0 then
    redis.call('PEXPIRE', KEYS[1], left)
else
    redis.call('DEL', KEYS[1])
end
return 1
