-- PROMOTE_DUE: moves due retries (KEYS[1]) and scheduled refreshes (KEYS[2]) to the front of
-- their site's frontier list of their priority, and marks those sites ready. Members are
-- ``site\tpriority\tnonce\tentry``; one that is not is quarantined with its reason.
--
-- KEYS[1] = the retries waiting (keys.delayed), KEYS[2] = the refreshes waiting (keys.recrawls),
-- KEYS[3] = the ready set (keys.ready), KEYS[4] = the quarantine list (keys.quarantine).
-- ARGV[1] = most members moved per set;
-- ARGV[2..7] = pairs: what precedes and what follows a site's name in its keys
--   (keys.around_site): ARGV[2], ARGV[3] its frontier list of priority 0 (keys.frontier),
--   ARGV[4], ARGV[5] its levels set, ARGV[6], ARGV[7] its stats hash.
-- Returns how many members it moved.
--
-- Cluster: cross-slot: the sets of KEYS[1] and KEYS[2] hold every site's members; the script
-- builds each member's site keys from ARGV[2..7]. Cannot run on Redis Cluster as is (that would
-- need a set of due retries per site, and a global index of when each site has one due).
--@include _now.lua
--@include _site_key.lua
--@include _level_key.lua
local ready, quarantine = KEYS[3], KEYS[4]
local FRONTIER, LEVELS, STATS = 2, 4, 6
local now = now_ms()
local moved = 0
for _, set in ipairs({{KEYS[1], 'delayed', 'delayed'}, {KEYS[2], 'recrawl', 'recrawls'}}) do
    local key, what, counter = set[1], set[2], set[3]
    local due = redis.call('ZRANGEBYSCORE', key, '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
    for _, member in ipairs(due) do
        local a = string.find(member, '\t', 1, true)
        local b = a and string.find(member, '\t', a + 1, true)
        local c = b and string.find(member, '\t', b + 1, true)
        local site, priority = a and string.sub(member, 1, a - 1), b and string.sub(member, a + 1, b - 1)
        local level = priority and tonumber(priority)
        if not c or site == '' or not level or level ~= math.floor(level) or tostring(level) ~= priority then
            -- Not a member this crawler wrote: kept aside with its reason, never retried.
            redis.call('LPUSH', quarantine, cjson.encode({when = now / 1000, source = key,
                reason = 'malformed ' .. what .. ' member', content = {member = string.sub(member, 1, 500)}}))
            redis.call('LTRIM', quarantine, 0, 9999)
        else
            redis.call('LPUSH', level_key(site_key(FRONTIER, site), priority), string.sub(member, c + 1))
            redis.call('ZADD', site_key(LEVELS, site), level, priority)
            redis.call('ZADD', ready, 'NX', now, site)
            redis.call('HINCRBY', site_key(STATS, site), counter, -1)
        end
        redis.call('ZREM', key, member)
    end
    moved = moved + #due
end
return moved
