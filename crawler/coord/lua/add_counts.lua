-- ADD_COUNTS: adds a process's pending counts of some sites (crawler.coord.counters.Counters): each
-- site's stats, unless the site was reset since they were counted (they would undo the reset), and its
-- metrics, which are never reset. One call for a write's sites, each field one command inside it; a
-- site's own reset read only when some site was reset since (the fleet's epoch moved).
--
-- KEYS[1] = the reset epoch (keys.reset_epoch); then the first site's stats hash (keys.stats), the epoch
--   of its last reset (keys.reset_at) and its metrics hash (keys.metrics); and so on, three keys a site.
-- ARGV: for each site, in the order of KEYS: the reset epoch its stats were counted at ('' = unknown: add
--   them), S, I and F (its numbers of stats fields, whole metrics fields and fractional ones), then S stats
--   pairs (field, increment), I whole metrics pairs (HINCRBY) and F fractional ones (HINCRBYFLOAT).
-- Returns {the reset epoch now, then the positions (1 = the first site) of the sites whose stats it dropped}.
--
-- Cluster: cross-slot: each site's three keys share its slot, but the epoch is global and a write
-- carries many sites.
local epoch = redis.call('GET', KEYS[1]) or '0'
local result = {tonumber(epoch) or 0}
local at = 1
for s = 2, #KEYS, 3 do
    local stats_key, reset_key, metrics_key = KEYS[s], KEYS[s + 1], KEYS[s + 2]
    local counted = ARGV[at]
    local stats, whole, fractional = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
    at = at + 4
    local add = counted == '' or counted == epoch
    if not add then
        -- Counted before some reset: this site's own, if it was reset after the epoch they were counted at.
        add = (tonumber(redis.call('GET', reset_key)) or 0) <= (tonumber(counted) or 0)
    end
    if add then
        for i = at, at + 2 * stats - 1, 2 do
            redis.call('HINCRBY', stats_key, ARGV[i], ARGV[i + 1])
        end
    elseif stats > 0 then
        result[#result + 1] = (s + 1) / 3
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
end
return result
