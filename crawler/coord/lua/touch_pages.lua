-- TOUCH_PAGES: resets the idle time of those of a consumer's entries still pending for it (not
-- their delivery count): an entry claimed meanwhile by another (this one was frozen past the
-- lease) stays theirs.
--
-- KEYS[1] = the pages stream (keys.pages).
-- ARGV[1] = the group, ARGV[2] = the consumer, ARGV[3..] = entry ids it holds.
-- Returns the ids touched.
--
-- Cluster: one key.
local ids, claim = {}, {'XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0}
for i = 3, #ARGV do
    if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2]) > 0 then
        ids[#ids + 1] = ARGV[i]
        claim[#claim + 1] = ARGV[i]
    end
end
if #ids > 0 then
    claim[#claim + 1] = 'JUSTID'
    redis.call(unpack(claim))
end
return ids
