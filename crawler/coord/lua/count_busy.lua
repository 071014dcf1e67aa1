-- COUNT_BUSY: how many worker processes have jobs in hand (their note in the busy set has not lapsed).
--
-- KEYS[1] = the busy set (keys.busy).
-- ARGV: none.
-- Returns the count.
--
-- Cluster: one key.
--@include _now.lua
return redis.call('ZCOUNT', KEYS[1], '(' .. now_ms(), '+inf')
