-- ADD_SEEN_FOR_A_WHILE: ADD_SEEN for seen URLs that expire (Spider.revisit_after): time-bucketed
-- seen sets, one per ARGV[2] ms of the Redis clock (keys.seen_bucket, index = now // width). A URL
-- is seen while its fingerprint is in the current bucket or one of the ARGV[3] before it; a new
-- one goes into the current bucket, which expires once the last lookup that can reach it is past.
-- So a URL added at t is seen until at least t + ARGV[3] x width (revisit_after) and at most one
-- width later, and is stored in one bucket only. The new ones are added with one SADD per 1,000,
-- not one each, as in ADD_SEEN.
--
-- KEYS[1] = the site's bucket of index ARGV[4] (keys.seen_bucket), KEYS[2..n] those of the
--   indexes after it, in order: the caller names them from its estimate of the Redis clock
--   (crawler.coord.redisclock), with room on both sides.
-- ARGV[1] = fingerprints (8 bytes each), concatenated, ARGV[2] = bucket width in ms,
--   ARGV[3] = buckets looked back (crawler.coord.frontier.SEEN_BUCKETS), ARGV[4] = the index of KEYS[1].
-- Returns a string of "1" (new, now added) or "0" per fingerprint, as ADD_SEEN; or false, adding
--   nothing, when the current bucket or one looked back is not in KEYS (the caller's estimate of
--   the clock is off: it reads the clock again and calls again).
--
-- Cluster: one slot: every bucket is a key of the site, passed in KEYS.
--@include _now.lua
local blob, width, back, first = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local current = math.floor(now_ms() / width)
if current - back < first or current > first + #KEYS - 1 then return false end
local buckets = {KEYS[current - first + 1]}
for i = 1, back do
    local key = KEYS[current - i - first + 1]
    if redis.call('EXISTS', key) == 1 then buckets[#buckets + 1] = key end
end
local flags, new, pending = {}, {}, {}
for i = 1, #blob, 8 do
    local member, seen = string.sub(blob, i, i + 7), 0
    if pending[member] then seen = 1 end
    for b = 1, #buckets do
        if seen == 1 then break end
        seen = redis.call('SISMEMBER', buckets[b], member)
    end
    if seen == 0 then
        new[#new + 1] = member
        pending[member] = true
    end
    flags[#flags + 1] = 1 - seen
end
for i = 1, #new, 1000 do
    redis.call('SADD', buckets[1], unpack(new, i, math.min(i + 999, #new)))
end
if #new > 0 then
    -- Reached by lookups until the end of bucket current + back; a second more for clock steps.
    redis.call('PEXPIREAT', buckets[1], string.format('%d', (current + back + 1) * width + 1000))
end
return table.concat(flags)
