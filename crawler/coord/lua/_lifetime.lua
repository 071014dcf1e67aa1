-- Helper: lifetime(), the lifetime in ms a gate script sets: ARGV[2], or more when KEYS[2] (a
-- hash, optional) holds a ``pace_ms`` field: that + ARGV[3] ms (the adaptive interval read at
-- this very moment; see crawler.coord.pacing).
local function lifetime()
    local ms = tonumber(ARGV[2])
    if KEYS[2] then
        local pace = tonumber(redis.call('HGET', KEYS[2], 'pace_ms'))
        if pace and pace + tonumber(ARGV[3]) > ms then ms = pace + tonumber(ARGV[3]) end
    end
    return ms
end
