-- Helper: conf_number(value, low), a number of a site's conf hash (keys.conf) as the crawler writes
-- it, or nil for anything else (written by hand: 'abc', 'inf', 'nan', below ``low``, above a year
-- of ms): such a field counts as absent, as crawler.coord.policy.conf_ms reads it, until the next
-- publish of the conf writes it again.
local function conf_number(value, low)
    local n = tonumber(value)
    if n and n >= low and n <= 31536000000 then return n end
    return nil
end
