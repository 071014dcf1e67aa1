-- FORGET_SEEN: drops one fingerprint from a site's seen tables and old seen sets (Frontier.forget).
--
-- KEYS[1] = a seen table (keys.seen_table, or a live keys.seen_window), KEYS[2..ARGV[3]] more of
--   them, the keys after them old seen sets of 8-byte members (keys.seen, keys.seen_bucket).
-- ARGV[1] = the fingerprint as a signed 64-bit decimal integer, ARGV[2] = as 8 raw bytes,
--   ARGV[3] = how many of KEYS are tables.
-- Returns how many tables and sets held it.
-- Built keys: each table's sub-sets, KEYS[i] .. ':' .. n (t.prefix .. n).
--
-- Cluster: one slot: every key of one site, the sub-sets' names start with their table's.
--@include _seen_table.lua
local tables, dropped = tonumber(ARGV[3]), 0
for i = 1, #KEYS do
    if i <= tables then
        local t, h = seen_table(KEYS[i], nil), seen_hash(ARGV[1])
        local b = h % t.size
        if b < t.s then b = h % (2 * t.size) end
        if t.n > 0 and redis.call('SREM', t.prefix .. b, ARGV[1]) == 1 then
            redis.call('HINCRBY', t.key, 'n', -1)
            dropped = dropped + 1
        end
    else
        dropped = dropped + redis.call('SREM', KEYS[i], ARGV[2])
    end
end
return dropped
