-- NEXT_JOB: one job id of the first due site whose gate is open, for a download worker
-- (crawler.scheduler.Scheduler.next), up to ARGV[17] ms before that gate opens. Moves the job
-- into RQ's intermediate list and re-scores the site one interval after its gate opens; a site
-- whose gate is closed is re-scored to when it opens.
--
-- KEYS[1] = the ready set (keys.ready); KEYS[2] = the set of sites the worker serves
--   (keys.group), absent when it serves every site.
-- ARGV[1] = refill when fewer jobs than this are left queued, ARGV[2] = sites looked at
--   before the worker is told to wait;
-- ARGV[3..16] = pairs: what precedes and what follows a site's name in its keys
--   (keys.around_site): ARGV[3], ARGV[4] its conf hash, ARGV[5], ARGV[6] its levels set,
--   ARGV[7], ARGV[8] its own gate, ARGV[9], ARGV[10] its queued set, ARGV[11], ARGV[12] its
--   RQ queue, ARGV[13], ARGV[14] that queue's intermediate list, ARGV[15], ARGV[16] its
--   started registry;
-- ARGV[17] = ms before its gate opens that a site's job may be handed out
--   (scheduler.PREPARE_AHEAD): the worker prepares it meanwhile, the gate still decides.
-- Returns {1, site, job_id, refill} | {2, site} (its RQ queue is empty: refill first) |
--   {0, wait_ms} | {-1} (no site has work).
--
-- Cluster: cross-slot: takes a site from the global ready set, then builds that site's keys
-- from ARGV[3..16] and reads the gate its conf names (a shared gate is in a slot of its own).
-- Cannot run on Redis Cluster as is: one call per page is what keeps the download path at one
-- round trip, and which site comes next is only known inside the call.
--@include _now.lua
--@include _site_key.lua
local ready = KEYS[1]
local group = KEYS[2]
local REFILL_BELOW, tries, ahead = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[17])
local CONF, LEVELS, GATE, QUEUED, QUEUE, INTERMEDIATE, STARTED = 3, 5, 7, 9, 11, 13, 15
local now = now_ms()
local SCAN_LIMIT = 1024

local function first_due()
    if not group then
        local head = redis.call('ZRANGE', ready, 0, 0, 'WITHSCORES')
        if #head == 0 then return nil end
        return head[1], tonumber(head[2])
    end
    -- Walk the ready set from its head to the first site of this worker's group: as
    -- cheap as the head when the group's sites have work, bounded by SCAN_LIMIT.
    for offset = 0, SCAN_LIMIT - 1, 64 do
        local chunk = redis.call('ZRANGE', ready, offset, offset + 63, 'WITHSCORES')
        if #chunk == 0 then return nil end
        for i = 1, #chunk, 2 do
            if redis.call('SISMEMBER', group, chunk[i]) == 1 then return chunk[i], tonumber(chunk[i + 1]) end
        end
    end
    return nil
end

for _ = 1, tries do
    local site, due = first_due()
    if site == nil then return {-1} end
    if due - ahead > now then return {0, due - ahead - now} end
    local conf = redis.call('HMGET', site_key(CONF, site), 'interval_ms', 'paused', 'concurrency', 'robots_delay_ms',
                            'pace_ms', 'margin_ms', 'gate')
    -- The interval in force (policy.effective_interval): the published one (margin included), or
    -- the robots.txt Crawl-delay or the adaptive pace, plus the margin, when longer.
    local margin = tonumber(conf[6]) or 0
    local interval = math.max(tonumber(conf[1]) or 1000, (tonumber(conf[4]) or 0) + margin,
                              (tonumber(conf[5]) or 0) + margin)
    local queue = site_key(QUEUE, site)
    local queued = redis.call('LLEN', queue)
    local compact = redis.call('ZCARD', site_key(LEVELS, site))
    if conf[2] == '1' then
        redis.call('ZADD', ready, now + 1000, site)
    elseif queued == 0 and compact > 0 then
        return {2, site}
    elseif queued == 0 then
        redis.call('ZREM', ready, site)
    else
        local cap = tonumber(conf[3])
        local busy = 0
        if cap then
            busy = redis.call('ZCARD', site_key(STARTED, site)) + redis.call('LLEN', site_key(INTERMEDIATE, site))
        end
        -- The gate the site's requests take: its own, or one it shares (by name, or by IP address).
        local gate_ttl = redis.call('PTTL', conf[7] or site_key(GATE, site))
        if cap and busy >= cap then
            redis.call('ZADD', ready, now + 50, site)
        elseif gate_ttl > ahead then
            -- Closed beyond ``ahead``: due again when it is within ``ahead`` of opening. A gate not
            -- yet rearmed still holds its send grace: look again no later than one interval from
            -- now, the soonest a rearm could let it open. Never due at once (this loop would spin).
            redis.call('ZADD', ready, now + math.max(ahead + 1, math.min(gate_ttl, interval + ahead)), site)
        else
            local job = redis.call('LMOVE', queue, site_key(INTERMEDIATE, site), 'LEFT', 'RIGHT')
            redis.call('ZREM', site_key(QUEUED, site), job)
            -- Handed out up to ``ahead`` ms before the gate opens: the next turn is one interval after that.
            redis.call('ZADD', ready, now + math.max(gate_ttl, 0) + interval, site)
            local refill = 0
            if queued - 1 < REFILL_BELOW and compact > 0 then refill = 1 end
            return {1, site, job, refill}
        end
    end
end
return {0, 0}
