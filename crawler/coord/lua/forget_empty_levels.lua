-- FORGET_EMPTY_LEVELS: drops from a site's levels set the priorities whose frontier list is
-- empty (atomic against a push, which adds its priority again).
--
-- KEYS[1] = the site's levels set (keys.levels); KEYS[2..] = the site's frontier lists
--   (keys.frontier) of the priorities in ARGV, in the same order.
-- ARGV[1..] = priorities; ARGV[i] is the priority of KEYS[i + 1].
-- Returns 1.
--
-- Cluster: one slot (every key is the site's).
for i = 1, #ARGV do
    if redis.call('LLEN', KEYS[i + 1]) == 0 then
        redis.call('ZREM', KEYS[1], ARGV[i])
    end
end
return 1
