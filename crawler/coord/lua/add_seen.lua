-- ADD_SEEN: adds URL fingerprints to a site's seen table, saying which were new.
-- The table (_seen_table.lua) keeps them as integers in sub-sets Redis stores as intsets, about
-- 9.5 B a fingerprint; a crawl begun before seen tables keeps its old set (8-byte members in a
-- hash table, about 56 B each): read while it exists, a member met there moving into the table;
-- calls with ARGV[4] = "move" (crawler.coord.seen.migrate) empty it.
--
-- KEYS[1] = the site's seen table (keys.seen_table), a hash; KEYS[2] = its old seen set (keys.seen).
-- ARGV[1] = the fingerprints as signed 64-bit decimal integers, then their addresses, in one
--   msgpack array (crawler.coord.seen.chunk_of; _seen_table.lua); ARGV[2] = the same fingerprints
--   as 8 raw bytes each (task.FINGERPRINT_BYTES), concatenated, in the same order; ARGV[3] = members a sub-set holds on average at most
--   (crawler.coord.seen.SUBSET_LOAD); ARGV[4] = "move" or "": "move" when the fingerprints are
--   members of the old set, to add to the table (unless there already) and remove from the old set;
--   ARGV[5] = the table's shape the caller last saw ("level split", from a reply) when ARGV[1] also
--   holds each fingerprint's sub-set's number for it, else "" (used only if the shape is still that).
-- Returns a string of, per fingerprint, "1" if it was new (now added), else "0", without a reply
--   (or an argument) per fingerprint to pack and parse; then ":" and the table's shape now.
-- Built keys: the table's sub-sets, KEYS[1] .. ':' .. n (t.prefix .. n).
--
-- Cluster: one slot: the table, its sub-sets (their names start with the table's, hash tag included) and the old set.
--@include _seen_table.lua
local named = (ARGV[5] or '') ~= ''
local m, n, flags = seen_members(ARGV[1], named and 3 or 2)
local t, moving, moved = seen_table(KEYS[1], nil), ARGV[4] == 'move', {}
seen_look(t, m, n, flags, named and ARGV[5] == seen_shape(t))
if not moving then seen_take_old(t, KEYS[2], ARGV[2], flags, moved) end
local new, count = seen_new(m, n, flags, moved)
seen_add(t, new, count, tonumber(ARGV[3]))
if moving then
    local raw, args = ARGV[2], {}
    for i = 1, n do args[i] = string.sub(raw, 8 * i - 7, 8 * i) end
    for first = 1, n, 1000 do
        redis.call('SREM', KEYS[2], unpack(args, first, math.min(first + 999, n)))
    end
end
return seen_reply(flags) .. ':' .. seen_shape(t)
