-- SCHEDULE: puts a member (``site\tpriority\tnonce\tentry``) in a set of waiting entries,
-- due ARGV[2] ms from now, and counts it in the site's stats. A member already there is only
-- moved in time (the refreshes of one page collapse), and not counted again.
--
-- KEYS[1] = the set: retries (keys.delayed) or refreshes (keys.recrawls); KEYS[2] = the
--   site's stats hash (keys.stats).
-- ARGV[1] = the member, ARGV[2] = delay in ms, ARGV[3] = its counter in the stats hash.
-- Returns 1.
--
-- Cluster: cross-slot: KEYS[1] is global (every site's members), KEYS[2] is the site's.
--@include _now.lua
if redis.call('ZADD', KEYS[1], now_ms() + tonumber(ARGV[2]), ARGV[1]) == 1 then
    redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
end
return 1
