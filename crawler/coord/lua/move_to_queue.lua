-- MOVE_TO_QUEUE: a refill's move of compact frontier entries into RQ jobs (crawler.coord.frontier.
-- Frontier.refill), made only if what the refill read is still so: the site's priorities, all of
-- them as read, and each list read still starting with the elements taken from (an entry, or a
-- pack of entries: crawler.coord.packs). Then: the writes that make the jobs, each list trimmed of
-- the elements taken whole, the last one read replaced by what is left of it when only part of it
-- was taken, the list's extra count (keys.frontier_extra) changed by what the packs taken held, the
-- priorities whose list is left empty dropped from the levels set (as FORGET_EMPTY_LEVELS) and from
-- the extra counts, and with ARGV[1] the site made due at once in the ready set (if it is there). A list changed in between (a retry promoted to its head,
-- an evicted job handed back, a new priority pushed) writes nothing: the refill reads again.
--
-- KEYS[1] = the site's levels set (keys.levels), KEYS[2] = the ready set (keys.ready), KEYS[3] =
--   the site's extra counts (keys.frontier_extra), KEYS[4 .. 3 + L] = the frontier lists read
--   (keys.frontier), then the keys the writes name.
-- ARGV[1] = the site to make due at once, or '' for none; ARGV[2] = P, then the P members of the
--   levels set as read (highest first); then L, and for each of the L lists: its priority, the
--   count E of elements read from its head, those E elements, how many of them are taken whole
--   (the first ones), the change to its extra count, and what replaces element E when only part of
--   it was taken ('' when none); then W, and W writes, each: its command, the index in KEYS of the
--   one key it names (its first argument), the count of its other arguments, and those.
-- Returns 1 when the move was made, 0 when something read had changed (nothing written).
--
-- Cluster: cross-slot: the ready set is global, and the writes are RQ's (a job's hash is in a slot
-- of its own), as in the MULTI/EXEC this script replaced.
local levels, ready, extra = KEYS[1], KEYS[2], KEYS[3]
local at = 2
local count = tonumber(ARGV[at])
local read = redis.call('ZREVRANGE', levels, 0, -1)
if #read ~= count then return 0 end
for i = 1, count do
    if read[i] ~= ARGV[at + i] then return 0 end
end
at = at + count + 1
local lists = {}
for l = 1, tonumber(ARGV[at]) do
    local list, priority, read_count = KEYS[3 + l], ARGV[at + 1], tonumber(ARGV[at + 2])
    if read_count > 0 then
        local head = redis.call('LRANGE', list, 0, read_count - 1)
        if #head ~= read_count then return 0 end
        for i = 1, read_count do
            if head[i] ~= ARGV[at + 2 + i] then return 0 end
        end
    end
    at = at + 2 + read_count
    lists[l] = {list, priority, tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), ARGV[at + 3]}
    at = at + 3
end
at = at + 1
for _ = 1, tonumber(ARGV[at]) do
    local command, key, argc = ARGV[at + 1], KEYS[tonumber(ARGV[at + 2])], tonumber(ARGV[at + 3])
    redis.call(command, key, unpack(ARGV, at + 4, at + 3 + argc))
    at = at + 3 + argc
end
for _, read_list in ipairs(lists) do
    local list, priority, whole, change, rest = read_list[1], read_list[2], read_list[3], read_list[4], read_list[5]
    if whole > 0 then redis.call('LTRIM', list, whole, -1) end
    if rest ~= '' then redis.call('LSET', list, 0, rest) end
    if redis.call('LLEN', list) == 0 then
        redis.call('ZREM', levels, priority)
        if change ~= 0 then redis.call('HDEL', extra, priority) end
    elseif change ~= 0 then
        redis.call('HINCRBY', extra, priority, change)
    end
end
if ARGV[1] ~= '' then redis.call('ZADD', ready, 'XX', 0, ARGV[1]) end
return 1
