-- MARK_BUSY: notes that a worker process has jobs in hand, for ARGV[2] ms from now (Redis clock),
-- or (ARGV[2] = 0) that it has none left; and forgets the notes that lapsed (a process that died).
--
-- KEYS[1] = the busy set (keys.busy).
-- ARGV[1] = the process's member (host:pid:keeper), ARGV[2] = milliseconds the note holds (0: remove it).
-- Returns the number of processes noted busy now.
--
-- Cluster: one key.
--@include _now.lua
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local ttl = tonumber(ARGV[2])
if ttl > 0 then
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
else
    redis.call('ZREM', KEYS[1], ARGV[1])
end
return redis.call('ZCARD', KEYS[1])
