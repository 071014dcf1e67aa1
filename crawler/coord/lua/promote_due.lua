-- PROMOTE_DUE: moves members of a waiting set, found due by DUE_MEMBERS, to the front of their
-- site's frontier list of their priority, and marks those sites ready. Members are
-- ``site\tpriority\tnonce\tentry``; one the caller found malformed is quarantined with its
-- reason. A member no longer in the set (another worker moved it) is left alone, so each is
-- moved once. A site newly marked ready is announced on the wake channel (idle workers look).
--
-- KEYS[1] = the set (keys.delayed or keys.recrawls), KEYS[2] = the ready set (keys.ready),
--   KEYS[3] = the quarantine list (keys.quarantine); KEYS[4..] = per well-formed member, three
--   keys of its site: its frontier list of the member's priority (keys.frontier), its levels
--   set, its stats hash.
-- ARGV[1] = what the set holds, for a quarantine reason ('delayed' or 'recrawl'), ARGV[2] = the
--   stats field counting them ('delayed' or 'recrawls'), ARGV[3] = the wake channel (keys.wake);
--   ARGV[4..] = pairs per member: the member, and the index in KEYS of its first site key
--   (0: malformed).
-- Returns how many members it moved or quarantined.
--
-- Cluster: cross-slot: the set, the ready set and the quarantine are global keys, and the
-- members are of any site (that would need a set of due members per site, and a global index of
-- when each site has one due).
--@include _now.lua
local set, ready, quarantine = KEYS[1], KEYS[2], KEYS[3]
local what, counter, wake = ARGV[1], ARGV[2], ARGV[3]
local now = now_ms()
local moved = 0
for i = 4, #ARGV, 2 do
    local member, first = ARGV[i], tonumber(ARGV[i + 1])
    if redis.call('ZREM', set, member) == 1 then
        moved = moved + 1
        if first == 0 then
            -- Not a member this crawler wrote: kept aside with its reason, never retried.
            redis.call('LPUSH', quarantine, cjson.encode({when = now / 1000, source = set,
                reason = 'malformed ' .. what .. ' member', content = {member = string.sub(member, 1, 500)}}))
            redis.call('LTRIM', quarantine, 0, 9999)
        else
            local a = string.find(member, '\t', 1, true)
            local b = string.find(member, '\t', a + 1, true)
            local c = string.find(member, '\t', b + 1, true)
            local priority = string.sub(member, a + 1, b - 1)
            redis.call('LPUSH', KEYS[first], string.sub(member, c + 1))
            redis.call('ZADD', KEYS[first + 1], tonumber(priority), priority)
            local site = string.sub(member, 1, a - 1)
            if redis.call('ZADD', ready, 'NX', now, site) == 1 then
                redis.call('PUBLISH', wake, site)
            end
            redis.call('HINCRBY', KEYS[first + 2], counter, -1)
        end
    end
end
return moved
