-- ADD_COUNTS: adds a process's pending counts of some sites (crawler.coord.counters.Counters): each
-- site's stats, unless the site was reset since they were counted (they would undo the reset), and its
-- metrics, which are never reset. One call for a write's sites; a hash's fields read in one HMGET and
-- written in one HSET (an HINCRBY for a lone field); a site's own reset read only when some site was
-- reset since (the fleet's epoch moved).
--
-- KEYS[1] = the reset epoch (keys.reset_epoch); then the first site's stats hash (keys.stats), the epoch
--   of its last reset (keys.reset_at) and its metrics hash (keys.metrics); and so on, three keys a site.
-- ARGV: for each site, in the order of KEYS: the reset epoch its stats were counted at ('' = unknown: add
--   them), S, I and F (its numbers of stats fields, whole metrics fields and fractional ones), then S stats
--   pairs (field, increment), I whole metrics pairs and F fractional ones (kept with all their digits).
-- Returns {the reset epoch now, then the positions (1 = the first site) of the sites whose stats it dropped}.
--
-- Cluster: cross-slot: each site's three keys share its slot, but the epoch is global and a write
-- carries many sites.

-- Adds the n (field, increment) pairs of ARGV from `from` on to the fields of KEYS[k], and the m after them,
-- fractional: 2 commands for any number of fields, one for a lone field. Integers stay exact to 2^53.
local function add(k, from, n, m)
    local key = KEYS[k]
    if n + m == 1 then
        return redis.call(n == 1 and 'HINCRBY' or 'HINCRBYFLOAT', key, ARGV[from], ARGV[from + 1])
    end
    local names = {}
    for j = 1, n + m do
        names[j] = ARGV[from + 2 * j - 2]
    end
    local now = redis.call('HMGET', key, unpack(names))
    local put = {}
    for j = 1, n + m do
        local sum = (tonumber(now[j]) or 0) + tonumber(ARGV[from + 2 * j - 1])
        put[2 * j - 1] = names[j]
        put[2 * j] = string.format(j <= n and '%.0f' or '%.17g', sum)
    end
    redis.call('HSET', key, unpack(put))
end

local epoch = redis.call('GET', KEYS[1]) or '0'
local result = {tonumber(epoch) or 0}
local at = 1
for s = 2, #KEYS, 3 do
    local reset_key = KEYS[s + 1]
    local counted = ARGV[at]
    local stats, whole, fractional = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
    at = at + 4
    local added = counted == '' or counted == epoch
    if not added then
        -- Counted before some reset: this site's own, if it was reset after the epoch they were counted at.
        added = (tonumber(redis.call('GET', reset_key)) or 0) <= (tonumber(counted) or 0)
    end
    if added and stats > 0 then
        add(s, at, stats, 0)
    elseif stats > 0 then
        result[#result + 1] = (s + 1) / 3
    end
    at = at + 2 * stats
    if whole + fractional > 0 then
        add(s + 2, at, whole, fractional)
    end
    at = at + 2 * (whole + fractional)
end
return result
