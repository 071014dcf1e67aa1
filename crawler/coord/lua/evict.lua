-- EVICT: hands a queued (not yet taken) job back to the front of its site's frontier list of
-- its priority (its entries in their order: a batch job carries several), and deletes the job.
--
-- KEYS[1] = the site's queued set (keys.queued), KEYS[2] = the site's RQ queue, KEYS[3] = the
--   site's frontier list of the job's priority (keys.frontier), KEYS[4] = the site's levels set
--   (keys.levels), KEYS[5] = the job's hash (RQ's job key).
-- ARGV[1] = the job id, ARGV[2] = the job's priority, ARGV[3..] = its frontier entries, in order.
-- Returns 1 if it handed the job back, 0 if a worker had already taken it.
--
-- Cluster: cross-slot: KEYS[1..4] share the site's slot, but KEYS[5] is RQ's job hash, named by
-- the job id alone (RQ allows no hash tag in a job id), as every RQ transaction that writes a
-- job and its queue is.
redis.call('ZREM', KEYS[1], ARGV[1])
if redis.call('LREM', KEYS[2], 1, ARGV[1]) == 0 then return 0 end
for i = #ARGV, 3, -1 do redis.call('LPUSH', KEYS[3], ARGV[i]) end
redis.call('ZADD', KEYS[4], tonumber(ARGV[2]), ARGV[2])
redis.call('DEL', KEYS[5])
return 1
