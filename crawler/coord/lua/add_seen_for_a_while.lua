-- ADD_SEEN_FOR_A_WHILE: ADD_SEEN for seen URLs that expire (Spider.revisit_after): one seen table
-- (_seen_table.lua) per ARGV[2] ms of the Redis clock (keys.seen_window, index = now // width). A
-- URL is seen while its fingerprint is in the current table or one of the ARGV[3] before it; a new
-- one goes into the current table, whose keys expire once the last lookup that can reach them is
-- past. So a URL added at t is seen until at least t + ARGV[3] x width (revisit_after) and at most
-- one width later, and is stored in one table only. The time buckets of before seen tables (sets of
-- 8-byte members, keys.seen_bucket) are read while they last, never written.
--
-- KEYS[1] = the site's seen table of index ARGV[4] (keys.seen_window), KEYS[2..n] those of the
--   indexes after it, in order, then KEYS[n+1..2n] its old time buckets of the same indexes
--   (keys.seen_bucket): the caller names them from its estimate of the Redis clock
--   (crawler.coord.redisclock), with room on both sides.
-- ARGV[1] = fingerprints and their addresses, a msgpack array as ADD_SEEN's, ARGV[2] = bucket width
--   in ms, ARGV[3] = buckets looked back (crawler.coord.seen.SEEN_BUCKETS), ARGV[4] = the index of
--   KEYS[1], ARGV[5] = the fingerprints as 8 raw bytes each, concatenated, ARGV[6] = members a
--   sub-set holds on average at most (crawler.coord.seen.SUBSET_LOAD).
-- Returns a string of "1" (new, now added) or "0" per fingerprint, as ADD_SEEN; or false, adding
--   nothing, when the current bucket or one looked back is not in KEYS (the caller's estimate of
--   the clock is off: it reads the clock again and calls again).
-- Built keys: each table's sub-sets, KEYS[i] .. ':' .. n (t.prefix .. n).
--
-- Cluster: one slot: every table and old bucket is a key of the site, passed in KEYS; the sub-sets' names start with their table's.
--@include _now.lua
--@include _seen_table.lua
local width, back, first = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local count = #KEYS / 2
local current = math.floor(now_ms() / width)
if current - back < first or current > first + count - 1 then return false end
-- Reached by lookups until the end of bucket current + back; a second more for clock steps.
local expire_at = string.format('%d', (current + back + 1) * width + 1000)
local m, n, flags = seen_members(ARGV[1], 2)
local tables, olds = {}, {}
for i = 0, back do
    local at = current - i - first + 1
    tables[#tables + 1] = seen_table(KEYS[at], i == 0 and expire_at or nil)
    olds[#olds + 1] = KEYS[count + at]
end
for _, t in ipairs(tables) do seen_look(t, m, n, flags, false) end
seen_look_old(olds, ARGV[5], flags)
local new, added = seen_new(m, n, flags)
seen_add(tables[1], new, added, tonumber(ARGV[6]))
return seen_reply(flags)
