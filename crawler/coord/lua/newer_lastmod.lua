-- NEWER_LASTMOD: records each sitemap <lastmod> that is newer than the one recorded for its URL.
--
-- KEYS[1] = the site's lastmod hash (keys.lastmod).
-- KEYS[2] = optional: the set of fingerprints the sitemap being read has queued
--   (keys.sitemap_taken); a URL it holds is not queued again by the same document.
--   It expires an hour after its last write, should the reader die before deleting it.
-- ARGV[1] = fingerprints (8 bytes each), concatenated; ARGV[2..] = their lastmods, epoch
--   seconds, in the same order.
-- Returns one letter per fingerprint: "n" (none was recorded), "u" (newer than the one
--   recorded), "s" (not newer), "t" (newer, but the document queued it already: KEYS[2]).
--   "n" and "u" add the fingerprint to KEYS[2].
--
-- Cluster: one slot: both keys are tagged with the site.
local taken = KEYS[2]
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
    if taken and verdicts[i] ~= 's' and redis.call('SADD', taken, fp) == 0 then
        verdicts[i] = 't'
    end
end
if taken then
    redis.call('EXPIRE', taken, 3600)
end
return table.concat(verdicts)
