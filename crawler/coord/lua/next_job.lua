-- NEXT_JOB: one job id of the site PICK_SITE named, for a download worker
-- (crawler.coord.scheduler.Scheduler.take), if the site is still due within ARGV[3] ms and its gate
-- opens within that time. Moves the job into RQ's intermediate list and re-scores the site one
-- interval after its gate opens (as many intervals as the conf's ``batch``, at most 16, for a slow
-- site whose jobs carry that many URLs fetched in turn by one thread; Scheduler.batch_over brings
-- the site forward when such a job ends). Otherwise the site is re-scored to when it may be served (gate
-- closed, paused, at its concurrency cap), or leaves the ready set (no work at all).
--
-- KEYS[1] = the ready set (keys.ready); the site's keys: KEYS[2] its conf hash (keys.conf),
--   KEYS[3] its levels set (keys.levels), KEYS[4] its queued set (keys.queued), KEYS[5] its RQ
--   queue, KEYS[6] that queue's intermediate list, KEYS[7] its started registry, KEYS[8] its own
--   gate (keys.gate); KEYS[9] = the reaper's claims (keys.claims); KEYS[10] = the fleet's word that
--   a crawl is drained (keys.drained), void once a job is handed out; KEYS[11] = the gate the caller
--   last saw the conf name (a gate several sites share), absent when it knows of none.
-- ARGV[1] = the site (its member in the ready set), ARGV[2] = refill when fewer jobs than this
--   are left queued, ARGV[3] = ms before its gate opens that a site's job may be handed out
--   (scheduler.PREPARE_AHEAD): the worker prepares it meanwhile, the gate still decides,
--   ARGV[4] = ms the site is held out of other workers' picks while one refills its queue
--   (scheduler.REFILL_HOLD), ARGV[5] = ms after a hand-out that the reaper first looks at the site's
--   queue (the job's lease: its claim has lapsed by then if its worker died), ARGV[6] = the prefix
--   of RQ's job hashes (Job.redis_job_namespace_prefix): the job's is read along, a round trip less.
-- Returns {1, job_id, refill, again_ms, job_hash} (again_ms: when the site is due again, ms from now;
--   job_hash: HGETALL of the job's hash, empty if it is gone) |
--   {2} (its RQ queue is empty: refill, then call again; the site is
--   re-scored ARGV[4] ms ahead meanwhile, so other workers pick other sites, and the refill marks it
--   due again once done) |
--   {3, gate} (its conf names a gate that is not KEYS[9]: call again with that one) |
--   {0, wait_ms} (no job: the site is not due, or was re-scored; it is due again in wait_ms) |
--   {-1} (the site is not in the ready set, or has just left it: no work).
--
-- Built keys: the RQ hash of the job handed out, read only (prefix .. job, the prefix ARGV[6]).
-- Cluster: cross-slot: the site's keys share its slot, but the ready set and the claims are
-- global, and a shared gate is in a slot of its own. The re-scoring must be atomic with the hand-out (two workers
-- would otherwise be handed the same turn) and with the removal of a site found without work
-- (a push in between would be left unserved).
--@include _now.lua
--@include _conf.lua
local ready, conf_key, levels, queued_set, queue, intermediate, started, own_gate, claims, drained, known_gate =
    KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local site, REFILL_BELOW, ahead, hold = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local first_look = tonumber(ARGV[5])

local due = tonumber(redis.call('ZSCORE', ready, site))
if due == nil then return {-1} end
local now = now_ms()
if due - ahead > now then return {0, due - ahead - now} end
local queued = redis.call('LLEN', queue)
local compact = redis.call('ZCARD', levels)
if queued == 0 and compact == 0 then
    -- No work at all, whatever its conf says (paused or not): out of the ready set, its conf unread.
    redis.call('ZREM', ready, site)
    return {-1}
end
local conf = redis.call('HMGET', conf_key, 'interval_ms', 'paused', 'concurrency', 'robots_delay_ms', 'pace_ms',
                        'margin_ms', 'gate', 'batch')
-- The gate the site's requests take: its own, or one it shares (by name, or by IP address).
local gate = own_gate
if conf[7] then
    if conf[7] ~= known_gate then return {3, conf[7]} end
    gate = known_gate
end
-- The interval in force (policy.effective_interval): the published one (margin included), or
-- the robots.txt Crawl-delay or the adaptive pace, plus the margin, when longer. A field that
-- does not hold (written by hand) counts as absent.
local margin = conf_number(conf[6], 0) or 0
local interval = math.max(conf_number(conf[1], 1) or 1000, (conf_number(conf[4], 0) or 0) + margin,
                          (conf_number(conf[5], 0) or 0) + margin)
local function rescore(at)
    redis.call('ZADD', ready, at, site)
    return {0, at - ahead - now}
end
if conf[2] == '1' then return rescore(now + 1000) end
if queued == 0 then
    -- One worker refills; the others, which would all pick this site (the first due) and
    -- find the refill lock taken, pick other sites meanwhile.
    redis.call('ZADD', ready, now + hold, site)
    return {2}
end
local cap = conf_number(conf[3], 1)
if cap and redis.call('ZCARD', started) + redis.call('LLEN', intermediate) >= cap then return rescore(now + 50) end
local gate_ttl = redis.call('PTTL', gate)
if gate_ttl > ahead then
    -- Closed beyond ``ahead``: due again when it is within ``ahead`` of opening. A gate not
    -- yet rearmed still holds its send grace: look again no later than one interval from
    -- now, the soonest a rearm could let it open. Never due at once (the worker would spin).
    return rescore(now + math.max(ahead + 1, math.min(gate_ttl, interval + ahead)))
end
local job = redis.call('LMOVE', queue, intermediate, 'LEFT', 'RIGHT')
redis.call('ZREM', queued_set, job)
-- The reaper looks at the site once this job's lease could have lapsed, or sooner if it already would.
redis.call('ZADD', claims, 'LT', now + first_look, site)
-- A job in an intermediate list is what a drain look's cheap reads do not see: a word that the
-- crawl was drained, given before, no longer holds.
redis.call('DEL', drained)
-- Handed out up to ``ahead`` ms before the gate opens: the next turn is one interval after that,
-- or after the batch's span for a paced batch (its thread takes those turns).
local span = math.max(1, math.min(conf_number(conf[8], 1) or 1, 16))
local again = math.max(gate_ttl, 0) + interval * span
redis.call('ZADD', ready, now + again, site)
local refill = 0
if queued - 1 < REFILL_BELOW and compact > 0 then refill = 1 end
local prefix = ARGV[6]
return {1, job, refill, again - ahead, redis.call('HGETALL', prefix .. job)}
