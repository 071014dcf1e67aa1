-- NEWER_LASTMOD: records each sitemap <lastmod> that is newer than the one recorded for its URL.
--
-- KEYS[1] = the site's lastmod hash (keys.lastmod).
-- ARGV[1] = fingerprints (8 bytes each), concatenated; ARGV[2..] = their lastmods, epoch
--   seconds, in the same order.
-- Returns one letter per fingerprint: "n" (none was recorded), "u" (newer than the one
--   recorded), "s" (not newer).
--
-- Cluster: one key.
local blob, verdicts = ARGV[1], {}
for i = 1, #blob / 8 do
    local fp, lastmod = string.sub(blob, i * 8 - 7, i * 8), tonumber(ARGV[i + 1])
    local old = redis.call('HGET', KEYS[1], fp)
    if not old then
        redis.call('HSET', KEYS[1], fp, lastmod)
        verdicts[i] = 'n'
    elseif lastmod > tonumber(old) then
        redis.call('HSET', KEYS[1], fp, lastmod)
        verdicts[i] = 'u'
    else
        verdicts[i] = 's'
    end
end
return table.concat(verdicts)
