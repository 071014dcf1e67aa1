-- Helper: seen tables (crawler.coord.seen): 64-bit fingerprints stored as decimal integers in
-- sub-sets small enough for Redis to keep as intsets (8 B a member), by linear hashing.
-- A table is a hash, its KEYS entry (fields l = level, s = split pointer, n = members, o = 1 once no
-- set of before seen tables is left beside it), and its
-- sub-sets, named the table's name .. ':' .. b: names that start with a key passed in KEYS, its
-- hash tag included (the one key name built in a script: tests/coord/test_lua.py).
-- A member's address is h, its last nine decimal digits (a number below 1e9: exact in a double, so
-- no 64-bit arithmetic in Lua; the caller passes it with each member, a split reads it from the
-- member): sub-set h mod 2^l, or h mod 2^(l+1) when that is below s. Before members are added
-- the table splits sub-set s (its members whose h has bit l set move to s + 2^l; s moves on; l
-- grows when s reaches 2^l) while it would hold more than `load` members a sub-set on average; an
-- unsplit sub-set holds up to twice the average, so `load` is kept well below half of
-- set-max-intset-entries (512 by default).
-- Members come as one msgpack array m (seen_members): m[i] the i-th member, m[n + i] its address,
-- and, when the caller knew the table's level and split pointer (the shape), m[2n + i] its sub-set's
-- number as a string: naming a key from a number (sprintf) took a third of a lookup's Redis time.
-- Lua time a member counts (it was most of a lookup's): no function call or table made a member.
local function seen_hash(member)
    local h = tonumber(string.sub(member, -9))
    if h < 0 then return -h end
    return h
end

-- A table's state; expire_at (ms, a string) or nil: when its keys expire, set on every write.
local function seen_table(key, expire_at)
    local state = redis.call('HMGET', key, 'l', 's', 'n', 'o')
    local t = {key = key, l = tonumber(state[1]) or 0, s = tonumber(state[2]) or 0, n = tonumber(state[3]) or 0}
    t.old_gone = state[4] == '1'
    t.size, t.prefix, t.expire_at = 2 ^ t.l, key .. ':', expire_at
    return t
end

-- The members, their addresses and perhaps their sub-sets' numbers (one msgpack array, parsed in
-- one C call; parts: 2, or 3 with the numbers) and a flag 0 for each.
local function seen_members(packed, parts)
    local m, flags = cmsgpack.unpack(packed), {}
    local n = #m / parts
    for i = 1, n do flags[i] = 0 end
    return m, n, flags
end

-- The members (flags[i] == 0) by sub-set: the sub-sets in order met (and how many), per sub-set its
-- last member's index, each index linking to the one before in its sub-set.
local function seen_groups(t, m, n, flags)
    local head, nxt, order, count = {}, {}, {}, 0
    local size, s = t.size, t.s
    for i = 1, n do
        if flags[i] == 0 then
            local h = m[n + i]
            local b = h % size
            if b < s then b = h % (2 * size) end
            local last = head[b]
            if last == nil then
                count = count + 1
                order[count] = b
            else
                nxt[i] = last
            end
            head[b] = i
        end
    end
    return order, count, head, nxt
end

-- flags[i] = 1 for the members (not flagged yet) the table holds: one SISMEMBER a member when there
-- are about as many sub-sets as members, else one SMISMEMBER a sub-set. named: m holds the members'
-- sub-sets' numbers, for the table's shape as it is.
local function seen_look(t, m, n, flags, named)
    if t.n == 0 then return end
    local size, s, prefix = t.size, t.s, t.prefix
    if named and size + s >= n then
        for i = 1, n do
            if flags[i] == 0 then flags[i] = redis.call('SISMEMBER', prefix .. m[2 * n + i], m[i]) end
        end
        return
    elseif size + s >= n then
        for i = 1, n do
            if flags[i] == 0 then
                local h = m[n + i]
                local b = h % size
                if b < s then b = h % (2 * size) end
                flags[i] = redis.call('SISMEMBER', prefix .. b, m[i])
            end
        end
        return
    end
    local order, count, head, nxt = seen_groups(t, m, n, flags)
    local args, at = {}, {}
    for g = 1, count do
        local b = order[g]
        local k, i = 0, head[b]
        while i do
            k = k + 1
            args[k], at[k], i = m[i], i, nxt[i]
        end
        for first = 1, k, 1000 do
            local found = redis.call('SMISMEMBER', prefix .. b, unpack(args, first, math.min(first + 999, k)))
            for j = 1, #found do flags[at[first + j - 1]] = found[j] end
        end
    end
end

-- flags[i] = 1 for the members (not flagged yet) one of the sets of before seen tables holds: their
-- members are the 8 raw bytes (raw: concatenated, in the members' order). Read, never written.
local function seen_look_old(olds, raw, flags)
    if #olds == 0 or redis.call('EXISTS', unpack(olds)) == 0 then return end
    for _, old in ipairs(olds) do
        local args, at = {}, {}
        for i = 1, #flags do
            if flags[i] == 0 then
                args[#args + 1], at[#at + 1] = string.sub(raw, 8 * i - 7, 8 * i), i
            end
        end
        for first = 1, #args, 1000 do
            local found = redis.call('SMISMEMBER', old, unpack(args, first, math.min(first + 999, #args)))
            for j = 1, #found do flags[at[first + j - 1]] = found[j] end
        end
    end
end

local function seen_sadd(key, members, first, last, expire_at)
    for i = first, last, 1000 do
        redis.call('SADD', key, unpack(members, i, math.min(i + 999, last)))
    end
    if expire_at then redis.call('PEXPIREAT', key, expire_at) end
end

local function seen_split(t)
    local keep, move = {}, {}
    local from = t.prefix .. t.s
    for _, member in ipairs(redis.call('SMEMBERS', from)) do
        if seen_hash(member) % (2 * t.size) >= t.size then move[#move + 1] = member else keep[#keep + 1] = member end
    end
    if #move > 0 then
        if #keep + #move > 512 then -- an outgrown intset (a hash table now), written anew: an intset again
            redis.call('DEL', from)
            if #keep > 0 then seen_sadd(from, keep, 1, #keep, t.expire_at) end
        else
            for i = 1, #move, 1000 do
                redis.call('SREM', from, unpack(move, i, math.min(i + 999, #move)))
            end
        end
        seen_sadd(t.prefix .. (t.s + t.size), move, 1, #move, t.expire_at)
    end
    t.s = t.s + 1
    if t.s == t.size then t.l, t.s, t.size = t.l + 1, 0, t.size * 2 end
end

-- The members to add, no two alike (as m: members, then addresses), and how many: those not
-- flagged (a member met again is flagged: new once), and those `moved` (optional) marks.
local function seen_new(m, n, flags, moved)
    local new, at, count, pending = {}, {}, 0, {}
    for i = 1, n do
        local member = m[i]
        if flags[i] == 0 or (moved and moved[i]) then
            if pending[member] then
                flags[i] = 1
            else
                count = count + 1
                new[count], at[count] = member, i
                pending[member] = true
            end
        end
    end
    for k = 1, count do new[count + k] = m[n + at[k]] end
    return new, count
end

local function seen_save(t)
    redis.call('HSET', t.key, 'l', string.format('%d', t.l), 's', string.format('%d', t.s), 'n', string.format('%d', t.n))
    if t.expire_at then redis.call('PEXPIREAT', t.key, t.expire_at) end
end

-- Adds the new members (m, n: as seen_new gives them) one SADD a sub-set, splitting first as `load` says.
local function seen_add(t, m, n, load)
    if n == 0 then return end
    t.n = t.n + n
    while t.n > load * (t.size + t.s) do seen_split(t) end
    local flags, args = {}, {}
    for i = 1, n do flags[i] = 0 end
    local order, count, head, nxt = seen_groups(t, m, n, flags)
    for g = 1, count do
        local b = order[g]
        local k, i = 0, head[b]
        while i do
            k = k + 1
            args[k], i = m[i], nxt[i]
        end
        seen_sadd(t.prefix .. b, args, 1, k, t.expire_at)
    end
    seen_save(t)
end

-- The members not flagged yet that the set of before seen tables `old` holds: flagged (seen), marked
-- in `moved` (to be added to the table), and taken out of the old set. raw: as seen_look_old's.
-- Once the old set is found gone (emptied, or never made), table t says so (field o = 1) and it is
-- not looked for again: one EXISTS a call saved.
local function seen_take_old(t, old, raw, flags, moved)
    if t.old_gone then return end
    if redis.call('EXISTS', old) == 0 then
        redis.call('HSET', t.key, 'o', 1)
        t.old_gone = true
        return
    end
    local args, at, found_raw = {}, {}, {}
    for i = 1, #flags do
        if flags[i] == 0 then
            args[#args + 1], at[#at + 1] = string.sub(raw, 8 * i - 7, 8 * i), i
        end
    end
    for first = 1, #args, 1000 do
        local found = redis.call('SMISMEMBER', old, unpack(args, first, math.min(first + 999, #args)))
        for j = 1, #found do
            if found[j] == 1 then
                local i = at[first + j - 1]
                flags[i], moved[i] = 1, true
                found_raw[#found_raw + 1] = args[first + j - 1]
            end
        end
    end
    for first = 1, #found_raw, 1000 do
        redis.call('SREM', old, unpack(found_raw, first, math.min(first + 999, #found_raw)))
    end
end

-- The reply: "1" for each member not flagged (new), "0" for the others.
local function seen_reply(flags)
    local reply = {}
    for i = 1, #flags do reply[i] = 1 - flags[i] end
    return table.concat(reply)
end

-- The table's shape, as the caller names sub-sets from it: "level split".
local function seen_shape(t)
    return string.format('%d %d', t.l, t.s)
end
