-- RECLAIM_PAGES: claims for a parse worker the pages stream's entries pending at least ARGV[3]
-- ms, oldest first, in one script so that no two consumers claim one entry. Whose delivery
-- count is raised, of the entries a vanished holder left:
-- * all of them, when each was on its first delivery: the holder ran them as one batch, its
--   records held until the end (``parsing``), so any of them may have been running; they run
--   one at a time from then on, so this costs a page that did no harm one delivery at most;
-- * else the oldest alone: a worker running entries one at a time acknowledges each when done,
--   so the oldest it left is the one it was running, and the others keep their count (a page
--   that kills its worker does not use up the deliveries of the pages queued behind it).
-- An entry deleted without being acknowledged leaves the pending list.
--
-- KEYS[1] = the pages stream (keys.pages).
-- ARGV[1] = the group, ARGV[2] = the claiming consumer, ARGV[3] = least idle ms,
--   ARGV[4] = most entries.
-- Returns {{id, deliveries, {field, value, ...}}, ...}.
--
-- Cluster: one key.
local found, batch = {}, {}
for _, p in ipairs(redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[3], '-', '+', ARGV[4])) do
    local id, holder, deliveries = p[1], p[2], p[4]
    local entry = redis.call('XRANGE', KEYS[1], id, id)[1]
    if not entry then
        redis.call('XACK', KEYS[1], ARGV[1], id)
    else
        found[#found + 1] = {id, holder, deliveries, entry[2]}
        batch[holder] = (batch[holder] ~= false) and deliveries == 1
    end
end
local claimed, blamed = {}, {}
for _, f in ipairs(found) do
    local id, holder, deliveries = f[1], f[2], f[3]
    if batch[holder] or not blamed[holder] then
        blamed[holder] = true
        deliveries = deliveries + 1
    end
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'RETRYCOUNT', deliveries, 'JUSTID')
    claimed[#claimed + 1] = {id, deliveries, f[4]}
end
return claimed
