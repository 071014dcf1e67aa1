-- ADD_SEEN: adds URL fingerprints to a site's seen set, saying which were new.
-- New members are added with one SADD per 1,000: one SADD each from a script costs ~9 B more per
-- member in Redis 6.2 (65.4 against 56.6 B per seen URL at a million, bench/memory.py).
--
-- KEYS[1] = the site's seen set (keys.seen).
-- ARGV[1] = fingerprints (crawler.coord.frontier.FINGERPRINT_BYTES, 8, each), concatenated.
-- Returns a string of, per fingerprint, "1" if it was new to the set (now added), else "0",
--   without a reply (or an argument) per fingerprint to pack and parse.
--
-- Cluster: one key.
local blob, flags, new, pending = ARGV[1], {}, {}, {}
for i = 1, #blob, 8 do
    local member = string.sub(blob, i, i + 7)
    if pending[member] or redis.call('SISMEMBER', KEYS[1], member) == 1 then
        flags[#flags + 1] = 0
    else
        new[#new + 1] = member
        pending[member] = true
        flags[#flags + 1] = 1
    end
end
for i = 1, #new, 1000 do
    redis.call('SADD', KEYS[1], unpack(new, i, math.min(i + 999, #new)))
end
return table.concat(flags)
