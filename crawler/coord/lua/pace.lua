-- PACE: updates a site's adaptive interval after one request (see crawler.coord.pacing), and keeps
-- the gate closed until the send + the new pace + the margin (never shortening it).
--
-- KEYS[1] = the site's conf hash (keys.conf; fields pace_ms, pace_why), KEYS[2] = the gate the
--   request took (keys.gate).
-- ARGV[1] = event: 'ok' (a healthy answer), 'error' (another 5xx), 'throttle' (429/503/504,
--   timeout, no connection); ARGV[2] = the request's elapsed ms; ARGV[3], ARGV[4] = min, max ms;
--   ARGV[5] = factor, ARGV[6] = ease; ARGV[7] = what happened ('503', 'timeout'); ARGV[8] = the
--   gate margin in ms; ARGV[9] = ms since the request was sent.
-- Returns {pace_ms, why}.
--
-- Cluster: one slot when the gate is the site's own; cross-slot for a shared gate (Spider.gate,
-- gate_by = "ip"), which is in a slot of its own.
--@include _conf.lua
local conf, gate = KEYS[1], KEYS[2]
local event, elapsed = ARGV[1], math.floor(tonumber(ARGV[2]))
local lo, hi, factor, ease = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local old = conf_number(redis.call('HGET', conf, 'pace_ms'), 0) or lo  -- a pace written by hand that does not hold: none
local target = math.floor(factor * elapsed)
local because = 'last ' .. elapsed .. ' ms × ' .. ARGV[5]
local new, why
if event == 'throttle' then
    new, why = old * 2, 'doubled after ' .. ARGV[7]
elseif event == 'error' then
    if target > old then new, why = target, because else new, why = old, 'held after ' .. ARGV[7] end
else
    local eased = math.floor(old * (1 - ease))
    if target >= eased then new, why = target, because else new, why = eased, 'easing off, ' .. because end
end
if new <= lo then
    new, why = lo, why .. ', at min'
elseif new >= hi then
    new, why = hi, why .. ', at max'
end
new = math.floor(new)
redis.call('HSET', conf, 'pace_ms', new, 'pace_why', why)
local closed_until = new + tonumber(ARGV[8]) - tonumber(ARGV[9])
if closed_until > 0 then
    local ttl = redis.call('PTTL', gate)
    if ttl == -2 then
        redis.call('SET', gate, 'pace', 'PX', closed_until)
    elseif ttl >= 0 and ttl < closed_until then
        redis.call('PEXPIRE', gate, closed_until)
    end
end
return {new, why}
