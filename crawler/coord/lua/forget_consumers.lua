-- FORGET_CONSUMERS: removes parse workers' consumers with nothing pending, idle at least ARGV[2]
-- ms, checked and removed in one step so that no pending entry goes with them.
--
-- KEYS[1] = the pages stream (keys.pages).
-- ARGV[1] = the group, ARGV[2] = least idle ms, ARGV[3] = one consumer's name ('' = any).
-- Returns how many were removed.
--
-- Cluster: one key.
local removed = 0
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
    local f = {}
    for i = 1, #c, 2 do f[c[i]] = c[i + 1] end
    if f['pending'] == 0 and f['idle'] >= tonumber(ARGV[2]) and (ARGV[3] == '' or ARGV[3] == f['name']) then
        redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], f['name'])
        removed = removed + 1
    end
end
return removed
