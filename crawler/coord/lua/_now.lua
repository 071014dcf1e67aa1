-- Helper: now_ms(), the Redis clock in milliseconds (the clock every score and due time uses).
local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
