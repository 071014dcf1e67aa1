-- BATCH_OVER: a paced batch of a site (one thread fetching a slow site's URLs in turn) is over:
-- the site, held out of other workers' picks by NEXT_JOB for the batch's whole span, is due
-- again when its own gate opens, if that is sooner (crawler.coord.scheduler.Scheduler.batch_over).
-- A site no longer in the ready set is left out of it (no work).
--
-- KEYS[1] = the ready set (keys.ready), KEYS[2] = the site's own gate (keys.gate).
-- ARGV[1] = the site.
-- Returns 1 if the site's score was brought forward, else 0.
--
-- Cluster: cross-slot: the ready set is global and the gate is in its site's slot; the PTTL and the ZADD
-- need not be atomic (a gate rearmed in between only makes the site due a moment early: NEXT_JOB
-- re-scores it to its gate).
--@include _now.lua
local ttl = redis.call('PTTL', KEYS[2])
if ttl < 0 then ttl = 0 end
return redis.call('ZADD', KEYS[1], 'XX', 'LT', 'CH', now_ms() + ttl, ARGV[1])
