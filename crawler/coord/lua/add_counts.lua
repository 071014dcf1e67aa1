-- ADD_COUNTS: adds a process's pending counts of some sites (crawler.coord.counters.Counters): each
-- site's stats, unless the site was reset since they were counted (they would undo the reset), and its
-- metrics, which are never reset. One call for a write's sites, each field one command inside it.
--
-- KEYS[1] = the first site's stats hash (keys.stats), KEYS[2] = its reset count (keys.resets),
--   KEYS[3] = its metrics hash (keys.metrics); and so on, three keys a site.
-- ARGV: for each site, in the order of KEYS: the reset count its stats were counted at ('' = unknown:
--   add them), S, I and F (its numbers of stats fields, whole metrics fields and fractional ones), then
--   S stats pairs (field, increment), I whole metrics pairs (HINCRBY) and F fractional ones (HINCRBYFLOAT).
-- Returns each site's reset count now, in the order of KEYS.
--
-- Cluster: cross-slot: each site's three keys share its slot, and a write carries many sites.
local now = {}
local at = 1
for s = 1, #KEYS, 3 do
    local stats_key, resets_key, metrics_key = KEYS[s], KEYS[s + 1], KEYS[s + 2]
    local resets = redis.call('GET', resets_key) or '0'
    local counted = ARGV[at]
    local stats, whole, fractional = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
    at = at + 4
    if counted == '' or counted == resets then
        for i = at, at + 2 * stats - 1, 2 do
            redis.call('HINCRBY', stats_key, ARGV[i], ARGV[i + 1])
        end
    end
    at = at + 2 * stats
    for i = at, at + 2 * whole - 1, 2 do
        redis.call('HINCRBY', metrics_key, ARGV[i], ARGV[i + 1])
    end
    at = at + 2 * whole
    for i = at, at + 2 * fractional - 1, 2 do
        redis.call('HINCRBYFLOAT', metrics_key, ARGV[i], ARGV[i + 1])
    end
    at = at + 2 * fractional
    now[#now + 1] = tonumber(resets) or 0
end
return now
