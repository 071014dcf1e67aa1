-- Helper: site_key(i, site), the key of ``site`` whose name ARGV[i] and ARGV[i + 1] surround:
-- what precedes and what follows a site's name in that kind of key, as keys.py builds it
-- (keys.around_site). For the scripts that meet sites as they run (NEXT_JOB, PROMOTE_DUE).
local function site_key(i, site)
    return ARGV[i] .. site .. ARGV[i + 1]
end
