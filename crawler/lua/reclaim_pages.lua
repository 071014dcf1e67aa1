-- RECLAIM_PAGES: claims for a parse worker the pages stream's entries pending at least ARGV[3]
-- ms, oldest first, in one script so that no two consumers claim one entry. A worker runs its
-- entries oldest first and acknowledges each when done, so the oldest entry a vanished holder
-- left is the one it was running: that one alone has its delivery count raised; the others were
-- never started and keep theirs (so a page that kills its worker does not use up the deliveries
-- of the pages queued behind it). An entry deleted without being acknowledged leaves the
-- pending list.
--
-- KEYS[1] = the pages stream (keys.pages).
-- ARGV[1] = the group, ARGV[2] = the claiming consumer, ARGV[3] = least idle ms,
--   ARGV[4] = most entries.
-- Returns {{id, deliveries, {field, value, ...}}, ...}.
--
-- Cluster: one key.
local claimed, blamed = {}, {}
for _, p in ipairs(redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[3], '-', '+', ARGV[4])) do
    local id, holder, deliveries = p[1], p[2], p[4]
    local entry = redis.call('XRANGE', KEYS[1], id, id)[1]
    if not entry then
        redis.call('XACK', KEYS[1], ARGV[1], id)
    else
        if not blamed[holder] then
            blamed[holder] = true
            deliveries = deliveries + 1
        end
        redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'RETRYCOUNT', deliveries, 'JUSTID')
        claimed[#claimed + 1] = {id, deliveries, entry[2]}
    end
end
return claimed
