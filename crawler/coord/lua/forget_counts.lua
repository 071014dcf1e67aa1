-- FORGET_COUNTS: deletes a site's stats for good (crawler.coord.counters.forget: crawler reset, crawl
-- --fresh): the counts processes made before, not yet written, never will be (ADD_COUNTS).
--
-- KEYS[1] = the site's stats hash (keys.stats), KEYS[2] = the epoch of its last reset (keys.reset_at),
--   KEYS[3] = the reset epoch (keys.reset_epoch).
-- ARGV: none.
-- Returns the new reset epoch.
--
-- Cluster: cross-slot: the site's keys share its slot, the epoch is global.
redis.call('DEL', KEYS[1])
local epoch = redis.call('INCR', KEYS[3])
redis.call('SET', KEYS[2], epoch)
return epoch
