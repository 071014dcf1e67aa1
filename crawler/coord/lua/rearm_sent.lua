-- REARM_SENT: ends a held gate's lifetime a given time from now, for a request sent earlier
-- (Gate.rearm_sent: its rearm went with the request's record, not at the send).
--
-- KEYS[1] = the gate (keys.gate); KEYS[2] = the ready set (keys.ready), optional, with ARGV[3].
-- ARGV[1] = token, ARGV[2] = ms left of the interval counted from the send (0 or less: over),
--   ARGV[3] = the site whose request it was (its member in the ready set).
-- Returns 1 if the token held it (its lifetime now ends ARGV[2] ms from now, or it is deleted
-- when that is 0 or less), 0 if it had expired or someone else holds it (left as it is: never
-- taken again, since no request goes with this call). When it held, the site's score in the
-- ready set (if there) is moved to when the gate now opens, if that is later: its next job is
-- then handed out as the gate opens, not before, when NEXT_JOB would find the gate closed and
-- re-score the site (a PICK_SITE and a NEXT_JOB lost for each request of a slow site).
--
-- Cluster: cross-slot: the ready set is global (one key without KEYS[2]); the ZADD need not be
-- atomic with the rearm: a site scored early is re-scored by NEXT_JOB, as before.
--@include _now.lua
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
local left = tonumber(ARGV[2])
if left > 0 then
    redis.call('PEXPIRE', KEYS[1], left)
else
    redis.call('DEL', KEYS[1])
end
if KEYS[2] then
    redis.call('ZADD', KEYS[2], 'XX', 'GT', now_ms() + math.max(left, 0), ARGV[3])
end
return 1
