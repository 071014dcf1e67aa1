-- PICK_SITE: the first site of the ready set, or of the part of it a download worker serves,
-- that is due within ARGV[1] ms (crawler.coord.scheduler.Scheduler.next). Reads only: NEXT_JOB then
-- hands out a job of that site, and checks again that it is due.
--
-- KEYS[1] = the ready set (keys.ready), sites scored by when their next job may be handed out
--   (ms, Redis clock); KEYS[2] = the set of sites the worker serves (keys.group), absent when it
--   serves every site.
-- ARGV[1] = ms before its score that a site may be picked (scheduler.PREPARE_AHEAD).
-- Returns {1, site, next_ms} | {0, wait_ms} (the first one is due in wait_ms) | {-1} (no site has work).
--   next_ms: when the site after the one named is due (ms from now, 0 if already), or -1 if there
--   is none, or -2 if it is not known (beyond the scan of a group): the worker that takes the site
--   knows when another thread of its process next has something to look for.
--
-- Cluster: cross-slot: the ready set and a group set are global keys without a hash tag, each
-- in a slot of its own; without a group it touches one key.
--@include _now.lua
local ready, group, ahead = KEYS[1], KEYS[2], tonumber(ARGV[1])
local SCAN_LIMIT = 1024
local site, due, after
if not group then
    local head = redis.call('ZRANGE', ready, 0, 1, 'WITHSCORES')
    if #head > 0 then site, due = head[1], tonumber(head[2]) end
    if #head > 2 then after = tonumber(head[4]) end
    if site and not after then after = -1 end
else
    -- Walk the ready set from its head to the first two sites of this worker's group: as cheap
    -- as the head when the group's sites have work, bounded by SCAN_LIMIT.
    local scanned_all = false
    for offset = 0, SCAN_LIMIT - 1, 64 do
        local chunk = redis.call('ZRANGE', ready, offset, offset + 63, 'WITHSCORES')
        local members = {}
        for i = 1, #chunk, 2 do members[#members + 1] = chunk[i] end
        -- One SMISMEMBER a chunk, not a SISMEMBER a site: a look costs the same whoever is in the group.
        local inside = #members > 0 and redis.call('SMISMEMBER', group, unpack(members)) or {}
        for j = 1, #members do
            if inside[j] == 1 then
                if site then
                    after = tonumber(chunk[2 * j])
                    break
                end
                site, due = members[j], tonumber(chunk[2 * j])
            end
        end
        if after or #chunk < 128 then
            scanned_all = #chunk < 128
            break
        end
    end
    if site and not after then after = scanned_all and -1 or -2 end
end
if site == nil then return {-1} end
local now = now_ms()
if due - ahead > now then return {0, due - ahead - now} end
if after >= 0 then after = math.max(0, after - ahead - now) end
return {1, site, after}
