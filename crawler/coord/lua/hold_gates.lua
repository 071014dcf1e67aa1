-- HOLD_GATES: closes gates for at least a hold each, after a failover (``failover``), never
-- shortening a longer closure: a gate written just before the old primary died may be lost.
--
-- KEYS[1] = the first gate (keys.gate), and so on to KEYS[n]; then the pace hashes some of them
--   read (keys.conf).
-- ARGV[1] = a token to hold them with, ARGV[2] = n; then for each gate i three values: the
--   hold in ms, the index in KEYS of its pace hash (0: none), ms added to that pace.
-- Returns the longest closure left, in ms, of the gates it was given.
--
-- Cluster: cross-slot: the gates of many sites at once (a gate held on its first take after a
-- failover is one slot with its own site's conf, as ACQUIRE_OR_PTTL).
local n = tonumber(ARGV[2])
local longest = 0
for i = 1, n do
    local ms = tonumber(ARGV[3 * i])
    local pace_at = tonumber(ARGV[3 * i + 1])
    if pace_at > 0 then
        local pace = tonumber(redis.call('HGET', KEYS[pace_at], 'pace_ms'))
        if pace and pace >= 0 and pace <= 31536000000 and pace + tonumber(ARGV[3 * i + 2]) > ms then
            ms = pace + tonumber(ARGV[3 * i + 2])
        end
    end
    ms = math.floor(ms)
    local ttl = redis.call('PTTL', KEYS[i])
    if ms >= 1 and ttl < ms then
        redis.call('SET', KEYS[i], ARGV[1], 'PX', ms)
        ttl = ms
    end
    if ttl > longest then longest = ttl end
end
return longest
