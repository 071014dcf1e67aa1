-- Helper: level_key(base, priority), the frontier list of one priority of a site (keys.frontier):
-- ``base`` is the site's list of priority 0, ``priority`` a string. The list of another priority
-- is named by appending ":PRIORITY" to ``base``, so it keeps base's hash tag (and Cluster slot).
local function level_key(base, priority)
    if priority == '0' then return base end
    return base .. ':' .. priority
end
