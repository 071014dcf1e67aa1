-- ADD_UNLESS_RESET: adds a process's pending counts to a site's stats hash, unless the site was
-- reset since they were counted (they would undo the reset) (crawler.coord.counters.Counters).
--
-- KEYS[1] = the site's stats hash (keys.stats), KEYS[2] = its reset count (keys.resets).
-- ARGV[1] = the reset count the increments were counted at ('' = unknown: add them),
-- ARGV[2..] = field, increment, field, increment, ...
-- Returns the reset count now.
--
-- Cluster: one slot (both keys carry the site's hash tag).
local resets = redis.call('GET', KEYS[2]) or '0'
if ARGV[1] == '' or ARGV[1] == resets then
    for i = 2, #ARGV, 2 do
        redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
    end
end
return tonumber(resets)
