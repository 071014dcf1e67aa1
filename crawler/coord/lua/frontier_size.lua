-- FRONTIER_SIZE: the entries waiting in a site's compact frontier, every priority, if the
-- priorities are still those the caller read.
--
-- KEYS[1] = the site's levels set (keys.levels); KEYS[2] = its extra counts (keys.frontier_extra:
--   the entries its lists' packs hold beyond one each); KEYS[3..] = the site's frontier lists
--   (keys.frontier) of the priorities in ARGV that are integers (no list is named by another).
-- ARGV[1..] = the priorities the caller read from KEYS[1] (ZRANGE, in its order).
-- Returns the number of entries, or -1 when KEYS[1] no longer holds exactly those priorities
-- (a push or a forget came in between: the caller reads them again).
--
-- Cluster: one slot (every key is the site's, passed in KEYS).
local levels = redis.call('ZRANGE', KEYS[1], 0, -1)
if #levels ~= #ARGV then return -1 end
for i = 1, #ARGV do
    if levels[i] ~= ARGV[i] then return -1 end
end
local n = 0
for i = 3, #KEYS do
    n = n + redis.call('LLEN', KEYS[i])
end
for _, more in ipairs(redis.call('HVALS', KEYS[2])) do
    n = n + (tonumber(more) or 0)
end
return n
