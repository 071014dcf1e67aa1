"""Which site a download worker serves next, in one round trip, whatever the site count.

Three structures in Redis make the crawl fast while the gate keeps it polite:

- the **compact frontier**, a list per site and priority of small JSON arrays (``[url,
  callback, depth, hops, attempt, meta, refresh, validators]`` with trailing defaults left out),
  which holds the bulk of queued URLs at a small fraction of an RQ job's size; a sorted
  set per site names the priorities that have entries, so refills drain the highest
  first;
- the **ready set**, a sorted set of the sites that have work, scored by the time
  (Redis clock, ms) their gate opens;
- per site **RQ queue** ``download:SITE`` holding only a few jobs ahead, refilled from
  the compact frontier just in time, so RQ still tracks what is in flight.

``NEXT_JOB`` takes the first due site from the ready set, moves one job id into RQ's
intermediate list and re-scores the site one interval ahead, all in one Lua call, so
workers are handed a site's jobs one interval apart. A site whose gate is still closed
(a slow predecessor, a Retry-After) is re-scored to the moment it opens, so no worker
waits behind it. The gate itself is still taken by the job right before its request:
the ready set spreads the work, the gate is the guarantee. Retries wait in one delayed
set (ms precision), scheduled refreshes in another, until ``PROMOTE_DUE`` moves them
back to the front of their priority's list.

Priority: a refill turns the highest-priority entries into RQ jobs first, and a push
of entries above the priority of jobs already made hands those jobs back to the
frontier (``EVICT``), so a high-priority request waits only for the ones of its own
priority (or higher) ahead of it, plus the request already in flight.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis import Redis
from rq import Queue
from rq.job import Job

from . import keys
from .replies import text

#: Jobs a refill tops a site's RQ queue up to, from its compact frontier.
JOBS_AHEAD = 4
#: A refill is asked for when fewer jobs than this are left queued (batches the refills).
REFILL_BELOW = 1
#: Sites looked at in one NEXT_JOB call before the worker is told to wait.
MAX_TRIES = 32
#: Seconds before a site's gate opens that one of its jobs is handed out: the worker claims
#: and prepares it (job, robots rules, headers) meanwhile and takes the gate the moment it
#: opens, so that chain is not lost from every interval. The gate still decides when it goes.
PREPARE_AHEAD = 0.015

# KEYS: none (every key is built from the prefixes, as RQ's own rate-limit script does).
# ARGV[1] = crawler key prefix ("crawler:"), ARGV[2] = RQ queue key prefix ("rq:queue:"),
# ARGV[3] = RQ started-registry prefix ("rq:wip:"), ARGV[4] = refill when fewer jobs are left,
# ARGV[5] = tries, ARGV[6] = key of the set of sites served ('' = all sites),
# ARGV[7] = what follows the site in its RQ queue key (''), ARGV[8] = in its started registry's (''),
# ARGV[9] = in its intermediate list's (":intermediate"), ARGV[10] = what precedes the site there
# ("rq:queue:download:"): RQ's key names, read from RQ (``rq_keys``), ARGV[11] = ms ahead of
# its gate's opening that a site's job is handed out (PREPARE_AHEAD).
# Returns {1, site, job_id, refill} | {2, site} (refill first) | {0, wait_ms} | {-1}.
NEXT_JOB = """
local p, qp, wp, qs, ws, is, ip = ARGV[1], ARGV[2], ARGV[3], ARGV[7], ARGV[8], ARGV[9], ARGV[10]
local REFILL_BELOW, tries, ahead = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[11])
local ready = p .. 'ready'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local group = ARGV[6]
local SCAN_LIMIT = 1024

local function first_due()
    if group == '' then
        local head = redis.call('ZRANGE', ready, 0, 0, 'WITHSCORES')
        if #head == 0 then return nil end
        return head[1], tonumber(head[2])
    end
    -- Walk the ready set from its head to the first site of this worker's group: as
    -- cheap as the head when the group's sites have work, bounded by SCAN_LIMIT.
    for offset = 0, SCAN_LIMIT - 1, 64 do
        local chunk = redis.call('ZRANGE', ready, offset, offset + 63, 'WITHSCORES')
        if #chunk == 0 then return nil end
        for i = 1, #chunk, 2 do
            if redis.call('SISMEMBER', group, chunk[i]) == 1 then return chunk[i], tonumber(chunk[i + 1]) end
        end
    end
    return nil
end

for _ = 1, tries do
    local site, due = first_due()
    if site == nil then return {-1} end
    if due - ahead > now then return {0, due - ahead - now} end
    local conf = redis.call('HMGET', p .. 'conf:' .. site, 'interval_ms', 'paused', 'concurrency', 'robots_delay_ms',
                            'pace_ms', 'margin_ms', 'gate')
    -- The interval in force (policy.effective_interval): the published one (margin included), or
    -- the robots.txt Crawl-delay or the adaptive pace, plus the margin, when longer.
    local margin = tonumber(conf[6]) or 0
    local interval = math.max(tonumber(conf[1]) or 1000, (tonumber(conf[4]) or 0) + margin,
                              (tonumber(conf[5]) or 0) + margin)
    local queue = qp .. site .. qs
    local intermediate = ip .. site .. is
    local queued = redis.call('LLEN', queue)
    local compact = redis.call('ZCARD', p .. 'levels:' .. site)
    if conf[2] == '1' then
        redis.call('ZADD', ready, now + 1000, site)
    elseif queued == 0 and compact > 0 then
        return {2, site}
    elseif queued == 0 then
        redis.call('ZREM', ready, site)
    else
        local cap = tonumber(conf[3])
        local busy = 0
        if cap then
            busy = redis.call('ZCARD', wp .. site .. ws) + redis.call('LLEN', intermediate)
        end
        -- The gate the site's requests take: its own, or one it shares (by name, or by IP address).
        local gate_ttl = redis.call('PTTL', conf[7] or (p .. 'gate:' .. site))
        if cap and busy >= cap then
            redis.call('ZADD', ready, now + 50, site)
        elseif gate_ttl > ahead then
            -- Not yet rearmed, the TTL still holds the send grace: look again no later than
            -- one interval from now, the soonest a rearm could let it open.
            redis.call('ZADD', ready, now + math.min(gate_ttl, interval), site)
        else
            local job = redis.call('LMOVE', queue, intermediate, 'LEFT', 'RIGHT')
            redis.call('ZREM', p .. 'queued:' .. site, job)
            -- Handed out up to ``ahead`` ms before the gate opens: the next turn is one interval after that.
            redis.call('ZADD', ready, now + math.max(gate_ttl, 0) + interval, site)
            local refill = 0
            if queued - 1 < REFILL_BELOW and compact > 0 then refill = 1 end
            return {1, site, job, refill}
        end
    end
end
return {0, 0}
"""

# Lua helper: the frontier list of one site and priority (keys.frontier).
_LEVEL_KEY = """
local function level_key(p, site, priority)
    if priority == '0' then return p .. 'frontier:' .. site end
    return p .. 'frontier:' .. site .. ':' .. priority
end
"""

# ARGV[1] = crawler key prefix, ARGV[2] = most entries to move per set.
# Moves due retries (``delayed``) and refreshes (``recrawl``) to the front of their site's
# frontier list of their priority and marks those sites ready. Members are
# ``site\tpriority\tnonce\tentry``. Returns how many moved.
PROMOTE_DUE = (
    _LEVEL_KEY
    + """
local p = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local moved = 0
for set, counter in pairs({delayed = 'delayed', recrawl = 'recrawls'}) do
    local due = redis.call('ZRANGEBYSCORE', p .. set, '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
    for _, member in ipairs(due) do
        local a = string.find(member, '\t', 1, true)
        local b = a and string.find(member, '\t', a + 1, true)
        local c = b and string.find(member, '\t', b + 1, true)
        local site, priority = a and string.sub(member, 1, a - 1), b and string.sub(member, a + 1, b - 1)
        local level = priority and tonumber(priority)
        if not c or site == '' or not level or level ~= math.floor(level) or tostring(level) ~= priority then
            -- Not a member this crawler wrote: kept aside with its reason, never retried.
            redis.call('LPUSH', p .. 'quarantine', cjson.encode({when = now / 1000, source = p .. set,
                reason = 'malformed ' .. set .. ' member', content = {member = string.sub(member, 1, 500)}}))
            redis.call('LTRIM', p .. 'quarantine', 0, 9999)
        else
            redis.call('LPUSH', level_key(p, site, priority), string.sub(member, c + 1))
            redis.call('ZADD', p .. 'levels:' .. site, level, priority)
            redis.call('ZADD', p .. 'ready', 'NX', now, site)
            redis.call('HINCRBY', p .. 'stats:' .. site, counter, -1)
        end
        redis.call('ZREM', p .. set, member)
    end
    moved = moved + #due
end
return moved
"""
)

# ARGV[1] = crawler key prefix, ARGV[2] = site, ARGV[3] = member, ARGV[4] = delay in ms,
# ARGV[5] = set ('delayed' | 'recrawl'), ARGV[6] = its counter in the site's stats.
# A member already scheduled is only moved in time (refreshes of one page collapse).
SCHEDULE = """
local p = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('ZADD', p .. ARGV[5], now + tonumber(ARGV[4]), ARGV[3]) == 1 then
    redis.call('HINCRBY', p .. 'stats:' .. ARGV[2], ARGV[6], 1)
end
return 1
"""

# ARGV[1] = crawler key prefix, ARGV[2] = RQ queue key, ARGV[3] = site, ARGV[4] = job id,
# ARGV[5] = the job's priority, ARGV[6] = its frontier entry, ARGV[7] = the job's RQ key.
# Hands a queued (not yet taken) job back to the front of its frontier list. Returns 1 if
# it did, 0 if a worker had already taken the job.
EVICT = (
    _LEVEL_KEY
    + """
local p, queue, site, job, priority = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
redis.call('ZREM', p .. 'queued:' .. site, job)
if redis.call('LREM', queue, 1, job) == 0 then return 0 end
redis.call('LPUSH', level_key(p, site, priority), ARGV[6])
redis.call('ZADD', p .. 'levels:' .. site, tonumber(priority), priority)
redis.call('DEL', ARGV[7])
return 1
"""
)

# ARGV[1] = crawler key prefix, ARGV[2] = site, ARGV[3..] = priorities.
# Forgets the priorities whose list is empty (atomic against a push, which re-adds them).
FORGET_EMPTY_LEVELS = (
    _LEVEL_KEY
    + """
local p, site = ARGV[1], ARGV[2]
for i = 3, #ARGV do
    if redis.call('LLEN', level_key(p, site, ARGV[i])) == 0 then
        redis.call('ZREM', p .. 'levels:' .. site, ARGV[i])
    end
end
return 1
"""
)

# ARGV[1] = crawler key prefix, ARGV[2..] = sites. Entries waiting in each site's frontier.
FRONTIER_SIZES = (
    _LEVEL_KEY
    + """
local p = ARGV[1]
local sizes = {}
for i = 2, #ARGV do
    local n = 0
    for _, priority in ipairs(redis.call('ZRANGE', p .. 'levels:' .. ARGV[i], 0, -1)) do
        n = n + redis.call('LLEN', level_key(p, ARGV[i], priority))
    end
    sizes[#sizes + 1] = n
end
return sizes
"""
)

# ARGV[1] = crawler key prefix, ARGV[2] = site, ARGV[3] = token, ARGV[4] = ms, ARGV[5] = why,
# ARGV[6] = the gate's key ('' = the site's own).
# Closes the site's gate for at least ARGV[4] ms for every worker (Retry-After, errors); a
# closure that lengthens the gate's is noted in the site's conf (closed_until, ms on the
# Redis clock, and closed_why) for ``crawler status``.
CLOSE_GATE = """
local p, site, ms = ARGV[1], ARGV[2], tonumber(ARGV[4])
local gate = p .. 'gate:' .. site
if ARGV[6] and ARGV[6] ~= '' then gate = ARGV[6] end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('PTTL', gate) < ms then
    redis.call('SET', gate, ARGV[3], 'PX', ms)
    redis.call('HSET', p .. 'conf:' .. site, 'closed_until', now + ms, 'closed_why', ARGV[5])
end
local score = redis.call('ZSCORE', p .. 'ready', site)
if score and tonumber(score) < now + ms then redis.call('ZADD', p .. 'ready', now + ms, site) end
return 1
"""


def rq_keys(connection: Redis) -> tuple[tuple[str, str], tuple[str, str], tuple[str, str]]:
    """What comes before and after a site's name in the keys of its RQ queue, started registry
    and intermediate list, as RQ itself names them (``RQ_KEY_PREFIX`` included), for NEXT_JOB."""
    marker = "\x00site\x00"
    queue = Queue(keys.download_queue(marker), connection=connection)
    found = [queue.key, queue.started_job_registry.key, queue.intermediate_queue_key]
    parts = [key.partition(marker) for key in found]
    if any(not sep for _, sep, _ in parts):  # RQ names these keys otherwise: the scheduler cannot serve
        raise RuntimeError(f"unexpected RQ key names: {found!r}")
    (qp, _, qs), (wp, _, ws), (ip, _, is_) = parts
    return (qp, qs), (wp, ws), (ip, is_)


def encode_entry(
    url: str,
    callback: str = "parse",
    depth: int = 0,
    hops: int = 0,
    attempt: int = 1,
    meta: dict[str, Any] | None = None,
    refresh: float | None = None,
    validators: Sequence[Any] | None = None,
) -> str:
    """A frontier entry: a JSON array with trailing default fields left out.

    ``validators`` ([etag, last_modified]) ride in a scheduled refresh's entry (``conditional``).
    """
    fields: list[Any] = [
        url,
        callback,
        depth,
        hops,
        attempt,
        meta or {},
        refresh,
        list(validators) if validators is not None else None,
    ]
    defaults: list[Any] = [None, "parse", 0, 0, 1, {}, None, None]
    while len(fields) > 1 and fields[-1] == defaults[len(fields) - 1]:
        fields.pop()
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=False)


def entry_encoder(
    callback: str = "parse",
    depth: int = 0,
    hops: int = 0,
    attempt: int = 1,
    meta: dict[str, Any] | None = None,
    refresh: float | None = None,
) -> Callable[[str], str]:
    """``encode_entry`` with every field but the URL fixed: for many URLs that share them (a page's links).

    The JSON of a list is its items' JSON joined, so only the URL is encoded per call.
    """
    tail = encode_entry("", callback, depth, hops, attempt, meta, refresh)[len('[""') :]
    return lambda url: "[" + _json_string(url) + tail


#: A str as JSON, exactly as ``encode_entry``'s ``json.dumps(..., ensure_ascii=False)`` writes it.
_json_string = json.JSONEncoder(ensure_ascii=False).encode


def decode_entry(entry: str | bytes) -> dict[str, Any]:
    """The fields of a frontier entry, defaults filled in (``validators`` only if present); ValueError if malformed."""
    fields = json.loads(entry)
    if not isinstance(fields, list) or not fields or not isinstance(fields[0], str) or len(fields) > 8:
        raise ValueError(f"malformed frontier entry: {entry!r:.200}")
    names = ("url", "callback", "depth", "hops", "attempt", "meta", "refresh", "validators")
    values: dict[str, Any] = {"callback": "parse", "depth": 0, "hops": 0, "attempt": 1, "meta": {}, "refresh": None}
    values.update(zip(names, fields, strict=False))
    return values


@dataclass(frozen=True)
class Next:
    """What NEXT_JOB answered: a job (with its site), a site to refill, a wait, or nothing."""

    site: str | None = None
    job_id: str | None = None
    refill: bool = False
    wait: float | None = None  # seconds; None with no site means no work at all


class Scheduler:
    """Client side of the scripts above, for one worker (or one command)."""

    def __init__(self, connection: Redis, sites: Sequence[str] = ()):
        self.connection = connection
        self.sites = sorted(set(sites))
        self.group = keys.group(self.sites) if self.sites else ""
        if self.sites:  # the same list always names the same set, so writing it again is harmless
            connection.sadd(self.group, *self.sites)
        self._next = connection.register_script(NEXT_JOB)
        self._promote = connection.register_script(PROMOTE_DUE)
        self._schedule = connection.register_script(SCHEDULE)
        self._close = connection.register_script(CLOSE_GATE)
        self._evict = connection.register_script(EVICT)
        self._forget_empty = connection.register_script(FORGET_EMPTY_LEVELS)
        self._rq_keys = rq_keys(connection)

    def next(self) -> Next:
        """One job id of the next due site whose gate is open (see NEXT_JOB)."""
        queue, registry, intermediate = self._rq_keys
        args: list[str | int] = [
            keys.PREFIX, queue[0], registry[0], REFILL_BELOW, MAX_TRIES, self.group,
            queue[1], registry[1], intermediate[1], intermediate[0], int(PREPARE_AHEAD * 1000),
        ]  # fmt: skip
        reply = self._next(args=args)
        code = int(reply[0])
        if code == 1:
            return Next(site=text(reply[1]), job_id=text(reply[2]), refill=bool(int(reply[3])))
        if code == 2:
            return Next(site=text(reply[1]), refill=True)
        if code == 0:
            return Next(wait=int(reply[1]) / 1000.0)
        return Next()

    def promote_due(self, limit: int = 100) -> int:
        """Move retries that have come due back to their frontiers. Returns how many."""
        return int(self._promote(args=[keys.PREFIX, limit]))

    def schedule(self, site: str, entry: str, delay: float, priority: int = 0) -> None:
        """Put ``entry`` back in ``site``'s frontier (at ``priority``) after ``delay`` seconds."""
        member = f"{site}\t{priority}\t{secrets.token_hex(4)}\t{entry}"
        self._schedule(args=[keys.PREFIX, site, member, max(0, int(delay * 1000)), "delayed", "delayed"])

    def schedule_refresh(self, site: str, entry: str, delay: float, priority: int) -> None:
        """Fetch ``entry``'s page again in ``delay`` seconds, whatever the seen set says.

        One page has one refresh pending: scheduling the same entry again moves it in time.
        """
        member = f"{site}\t{priority}\t-\t{entry}"
        self._schedule(args=[keys.PREFIX, site, member, max(0, int(delay * 1000)), "recrawl", "recrawls"])

    def evict(self, site: str, queue_key: str, job_id: str, priority: int, entry: str) -> bool:
        """Hand a queued job of ``site`` back to its frontier list; False if it was taken."""
        return bool(self._evict(args=[keys.PREFIX, queue_key, site, job_id, priority, entry, Job.key_for(job_id)]))

    def forget_empty_levels(self, site: str, priorities: Sequence[int]) -> None:
        """Drop the priorities of ``site`` whose frontier list is empty from its levels set."""
        if priorities:
            self._forget_empty(args=[keys.PREFIX, site, *priorities])

    def close_gate(self, site: str, seconds: float, why: str = "", gate_key: str | None = None) -> None:
        """Keep every worker away from ``site`` for at least ``seconds``; ``why`` is shown by ``crawler status``.

        ``gate_key``: the gate the request took, when not the site's own (a shared gate).
        """
        self._close(args=[keys.PREFIX, site, secrets.token_hex(8), max(1, int(seconds * 1000)), why, gate_key or ""])


def publish_conf(
    connection: Redis,
    site: str,
    interval: float,
    margin: float,
    paused: bool = False,
    concurrency: int | None = None,
    auto: bool = False,
    gate_key: str | None = None,
    gate_by_ip: bool = False,
) -> None:
    """Write the politeness NEXT_JOB obeys for ``site`` (interval incl. margin, margin, pause, cap).

    ``auto``: the interval is adaptive (its pace, kept in the same hash, applies); a fixed
    one drops any pace left from an adaptive one. ``gate_key``: the key of a gate shared
    by name (None: the site's own). ``gate_by_ip``: the gate is the address's, which the
    download workers write as they resolve it (left as it is here).
    """
    mapping = {
        "interval_ms": max(1, round((interval + margin) * 1000)),
        "margin_ms": round(margin * 1000),
        "paused": "1" if paused else "0",
    }
    with connection.pipeline(transaction=True) as pipe:
        pipe.hset(keys.conf(site), mapping=mapping)  # type: ignore[arg-type]
        if concurrency:
            pipe.hset(keys.conf(site), "concurrency", concurrency)
        else:
            pipe.hdel(keys.conf(site), "concurrency")
        if not auto:
            pipe.hdel(keys.conf(site), "pace_ms", "pace_why")
        if gate_key:
            pipe.hset(keys.conf(site), "gate", gate_key)
        elif not gate_by_ip:
            pipe.hdel(keys.conf(site), "gate")
        pipe.execute()


def frontier_sizes(connection: Redis, sites: Sequence[str]) -> list[int]:
    """Entries waiting in each site's frontier (every priority), in one round trip."""
    if not sites:
        return []
    return [int(n) for n in connection.register_script(FRONTIER_SIZES)(args=[keys.PREFIX, *sites])]
