-- DUE_MEMBERS: the members of waiting sets that are due by the Redis clock, oldest first: the
-- retries (keys.delayed) and refreshes (keys.recrawls) that PROMOTE_DUE then moves. Reads only.
--
-- KEYS[1] = a set of members scored by when they are due (ms on the Redis clock), KEYS[2..] more
--   such sets.
-- ARGV[1] = most members returned per set.
-- Returns a list per set in KEYS, in their order: its due members; then the ms until the first member
--   of any set not returned is due (0: some were left for the next call; -1: none waits).
--
-- Cluster: cross-slot: the retries and the refreshes sets are global keys without a hash tag,
-- each in a slot of its own (one call for both keeps an idle look at one round trip).
--@include _now.lua
local now, found, most, soonest = now_ms(), {}, tonumber(ARGV[1]), -1
for i = 1, #KEYS do
    -- One more than asked for: the first member not returned says when the next is due.
    local first = redis.call('ZRANGE', KEYS[i], 0, most, 'WITHSCORES')
    local due = {}
    for j = 1, #first, 2 do
        local wait = tonumber(first[j + 1]) - now
        if wait <= 0 and #due < most then
            due[#due + 1] = first[j]
        else
            if soonest < 0 or wait < soonest then soonest = math.max(0, wait) end
            break
        end
    end
    found[i] = due
end
found[#KEYS + 1] = math.floor(soonest)
return found
