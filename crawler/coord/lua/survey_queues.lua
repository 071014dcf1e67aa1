-- SURVEY_QUEUES: what the reaper (crawler.coord.joblife.survey) finds in each queue it looks at, and the
-- claims of the sites found with nothing to watch (nothing handed out, leased or scheduled) dropped in
-- the same step, so a job handed out meanwhile cannot be missed: NEXT_JOB claims its site again.
--
-- KEYS[1] = the claims (keys.claims); then four keys of each queue, in ARGV's order: the queue, its
--   intermediate list, its started registry, its scheduled registry.
-- ARGV = each queue's site, its member in the claims ('' for a queue of no site).
-- Returns an array, for each queue: {the started registry's first score, the scheduled registry's first score
--   (each nil when empty), job ids handed out, job ids queued}.
--
-- Cluster: cross-slot: the claims are global, each queue's keys in its site's slot.
local claims = KEYS[1]
local found = {}
for i = 1, #ARGV do
    local queue, intermediate, started, scheduled = KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i], KEYS[4 * i + 1]
    local lease = redis.call('ZRANGE', started, 0, 0, 'WITHSCORES')
    local retry = redis.call('ZRANGE', scheduled, 0, 0, 'WITHSCORES')
    local handed_out = redis.call('LLEN', intermediate)
    if ARGV[i] ~= '' and handed_out == 0 and #lease == 0 and #retry == 0 then
        redis.call('ZREM', claims, ARGV[i])
    end
    found[i] = {lease[2] or false, retry[2] or false, handed_out, redis.call('LLEN', queue)}
end
return found
