-- ADD_COUNTS: adds a process's pending counts of one site (crawler.coord.counters.Counters): its stats,
-- unless the site was reset since they were counted (they would undo the reset), and its metrics,
-- which are never reset. One call a site, where a command a field was some five a request.
--
-- KEYS[1] = the site's stats hash (keys.stats), KEYS[2] = its reset count (keys.resets),
-- KEYS[3] = its metrics hash (keys.metrics).
-- ARGV[1] = the reset count the stats were counted at ('' = unknown: add them),
-- ARGV[2] = S, the number of stats fields; ARGV[3] = I, the number of whole metrics fields;
-- then S stats pairs (field, increment), I whole metrics pairs (HINCRBY), and the rest
-- metrics pairs whose increments are fractional (HINCRBYFLOAT).
-- Returns the reset count now.
--
-- Cluster: one slot (every key carries the site's hash tag).
local resets = redis.call('GET', KEYS[2]) or '0'
local stats, whole = tonumber(ARGV[2]), tonumber(ARGV[3])
local at = 4
if ARGV[1] == '' or ARGV[1] == resets then
    for i = at, at + 2 * stats - 1, 2 do
        redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
    end
end
at = at + 2 * stats
for i = at, at + 2 * whole - 1, 2 do
    redis.call('HINCRBY', KEYS[3], ARGV[i], ARGV[i + 1])
end
for i = at + 2 * whole, #ARGV, 2 do
    redis.call('HINCRBYFLOAT', KEYS[3], ARGV[i], ARGV[i + 1])
end
return tonumber(resets)
