-- SETTLE_CLAIMS: after a reaper pass (crawler.coord.joblife.reap), when the reaper next looks at each
-- site it surveyed: a time, or never again for a site it found nothing to watch at (nothing handed
-- out, leased or scheduled), unless a job was handed out since the survey.
--
-- KEYS[1] = the claims (keys.claims); then, for each site to forget, in ARGV's order, three keys of
--   its RQ queue: its intermediate list, its started registry, its scheduled registry.
-- ARGV[1] = R, the number of sites looked at again later; then R pairs (site, ms from now); then
--   the sites to forget, each with its three KEYS; the last ARGV is the ms from now that a site
--   found with work again is looked at (the jobs' lease, as NEXT_JOB's first look).
-- Returns the number of sites forgotten.
--
-- Cluster: cross-slot: the claims are global, each site's queue keys in its own slot.
--@include _now.lua
local claims = KEYS[1]
local later = tonumber(ARGV[1])
local now = now_ms()
for i = 2, 2 * later, 2 do
    redis.call('ZADD', claims, now + tonumber(ARGV[i + 1]), ARGV[i])
end
local forgotten = 0
local lease = tonumber(ARGV[#ARGV])
local key = 2
for i = 2 * later + 2, #ARGV - 1 do
    local intermediate, started, scheduled = KEYS[key], KEYS[key + 1], KEYS[key + 2]
    key = key + 3
    if redis.call('LLEN', intermediate) + redis.call('ZCARD', started) + redis.call('ZCARD', scheduled) == 0 then
        redis.call('ZREM', claims, ARGV[i])
        forgotten = forgotten + 1
    else
        redis.call('ZADD', claims, now + lease, ARGV[i])
    end
end
return forgotten
