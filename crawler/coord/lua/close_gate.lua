-- CLOSE_GATE: closes a gate for at least ARGV[2] ms for every worker (Retry-After, a run of
-- errors), never shortening a longer closure.
--
-- KEYS[1] = the gate (keys.gate: the site's own, or a gate it shares).
-- ARGV[1] = a token to hold it with, ARGV[2] = ms.
-- Returns {until, lengthened}: the end of the closure asked for (ms, Redis clock), and 1 if
--   this call lengthened the gate's closure (else 0, the gate was closed for longer already).
--
-- Cluster: one key.
--@include _now.lua
local ms = tonumber(ARGV[2])
local closes = now_ms() + ms
if redis.call('PTTL', KEYS[1]) < ms then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ms)
    return {closes, 1}
end
return {closes, 0}
