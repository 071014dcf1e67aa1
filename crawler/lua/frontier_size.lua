-- FRONTIER_SIZE: the entries waiting in a site's compact frontier, every priority.
--
-- KEYS[1] = the site's levels set (keys.levels), KEYS[2] = its frontier list of priority 0
--   (keys.frontier); the list of priority P is KEYS[2] .. ':P'.
-- ARGV: none.
-- Returns the number of entries.
--
-- Cluster: one slot: the lists of the priorities found in KEYS[1] are named from KEYS[2] during
-- the call (they cannot be known before it), and keep its hash tag.
--@include _level_key.lua
local n = 0
for _, priority in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    n = n + redis.call('LLEN', level_key(KEYS[2], priority))
end
return n
