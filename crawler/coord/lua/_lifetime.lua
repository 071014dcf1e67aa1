-- Helper: lifetime(), the lifetime in ms a gate script sets: ARGV[2], or more when KEYS[2] (a
-- hash, optional) holds a ``pace_ms`` field: that + ARGV[3] ms (the adaptive interval read at
-- this very moment; see crawler.coord.pacing). A pace that is not a number of ms from 0 to a year
-- (written by hand: 'nan', 'inf', '-1') counts as none, as ``_conf.lua`` reads it.
local function lifetime()
    local ms = tonumber(ARGV[2])
    if KEYS[2] then
        local pace = tonumber(redis.call('HGET', KEYS[2], 'pace_ms'))
        if pace and not (pace >= 0 and pace <= 31536000000) then pace = nil end
        if pace and pace + tonumber(ARGV[3]) > ms then ms = pace + tonumber(ARGV[3]) end
    end
    return ms
end
