"""Which site a download worker serves next, in two round trips (one for a worker of one site).

The client side of the scheduling scripts (``crawler/coord/lua``) and the compact frontier
entry's format. ``PICK_SITE`` names the first due site of the ready set (sites scored by
when their gate opens); ``NEXT_JOB`` checks that it is still due, hands out one job id of
its RQ queue (a few jobs ahead, refilled from the compact frontier) and re-scores the site
one interval ahead, in one Lua call. The gate, taken right before each request, is still
the guarantee of spacing. Retries and refreshes wait in sorted sets until ``promote_due``.
The design: docs/ARCHITECTURE.md ("Download workers are handed a site", "Priorities").
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis import Redis
from rq import Queue
from rq.job import Job

from ..settings import DEFAULT_JOB_LEASE
from . import keys, lua
from .replies import text

#: Reads of a site's priorities before ``frontier_sizes`` takes one that keeps changing as busy.
FRONTIER_SIZE_TRIES = 5
#: Jobs a refill tops a site's RQ queue up to, from its compact frontier.
JOBS_AHEAD = 4
#: A refill is asked for when fewer jobs than this are left queued (batches the refills).
REFILL_BELOW = 1
#: Sites picked (PICK_SITE, then NEXT_JOB) in one look for a job before the worker looks again.
MAX_TRIES = 8
#: Seconds a worker waits when the site it just re-scored is due again at once (an interval
#: shorter than PREPARE_AHEAD, behind a closed gate): the next look, not a spin.
RETRY_SOON = 0.001
#: Seconds a site whose RQ queue ran dry is left out of other workers' picks while one refills it.
#: The refill marks it due again when done; a refill that found another under way (its lock
#: taken) does not, so this is also how long such a site may wait: short, but long enough that
#: a worker that picks it again meanwhile is one call every REFILL_HOLD, not a spin.
REFILL_HOLD = 0.05
#: Seconds before a site's gate opens that one of its jobs is handed out: the worker claims
#: and prepares it (job, robots rules, headers) meanwhile and takes the gate the moment it
#: opens, so that chain is not lost from every interval. The gate still decides when it goes.
PREPARE_AHEAD = 0.015
#: Seconds before its gate opens that a thread serving a slow site in turn (a paced batch's next
#: URL, or the site's next job: ``DownloadWorker.follow``) starts on its request: the thread is the
#: site's alone, so its round trips (job, refill, claim, settings) are taken off the interval. The
#: gate still decides when the request goes. At most half ``work.batching.PACED_MIN_INTERVAL``.
FOLLOW_AHEAD = 0.25
#: Longest seconds a process's looks for due retries and refreshes (``Scheduler.may_have_due``) trust the
#: last one's word that none is due yet: those another process schedules meanwhile come due at most this
#: late (its own are looked for when they come due).
PROMOTE_LOOKS_MOST = 1.0
#: The prefix of RQ's job hashes: NEXT_JOB reads the hash of the job it hands out.
JOB_PREFIX = Job.redis_job_namespace_prefix


def encode_entry(
    url: str,
    callback: str = "parse",
    depth: int = 0,
    hops: int = 0,
    attempt: int = 1,
    meta: dict[str, Any] | None = None,
    refresh: float | None = None,
    validators: Sequence[Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """A frontier entry: a JSON array with trailing default fields left out.

    ``validators`` ([etag, last_modified]) ride in a scheduled refresh's entry (``conditional``).
    ``extra``, the ninth field, is an object of the task's optional fields (a request's
    ``method``, ``headers``, ``body``, ``errback``, URL ``as_written``: ``DownloadTask.extra``),
    left out when empty (a plain GET's entry has eight fields at most, and older entries still read).
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
        dict(extra) if extra else None,
    ]
    defaults: list[Any] = [None, "parse", 0, 0, 1, {}, None, None, None]
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
    extra: Mapping[str, Any] | None = None,
) -> Callable[[str], str]:
    """``encode_entry`` with every field but the URL fixed, for many URLs that share them (a page's links):
    only the URL is encoded per call."""
    tail = encode_entry("", callback, depth, hops, attempt, meta, refresh, None, extra)[len('[""') :]
    return lambda url: "[" + _json_string(url) + tail


#: A str as JSON, exactly as ``encode_entry``'s ``json.dumps(..., ensure_ascii=False)`` writes it.
_json_string = json.JSONEncoder(ensure_ascii=False).encode

#: The fields of a frontier entry, in order.
ENTRY_FIELDS = ("url", "callback", "depth", "hops", "attempt", "meta", "refresh", "validators")


def decode_entry(entry: str | bytes) -> dict[str, Any]:
    """The fields of a frontier entry, defaults filled in (``validators`` only if present), and those of its
    ``extra`` object (none of them a field's name); ValueError if malformed."""
    fields = json.loads(entry)
    if not isinstance(fields, list) or not fields or not isinstance(fields[0], str) or len(fields) > 9:
        raise ValueError(f"malformed frontier entry: {entry!r:.200}")
    values: dict[str, Any] = {"callback": "parse", "depth": 0, "hops": 0, "attempt": 1, "meta": {}, "refresh": None}
    values.update(zip(ENTRY_FIELDS, fields, strict=False))
    if len(fields) == 9 and fields[8] is not None:
        extra = fields[8]
        if not isinstance(extra, dict) or set(extra) & {*ENTRY_FIELDS, "site", "priority"}:
            raise ValueError(f"malformed frontier entry (its ninth field): {entry!r:.200}")
        values.update(extra)
    return values


@dataclass(frozen=True)
class Next:
    """What the scheduler answered: a job (with its site), a site to refill, a wait, or nothing."""

    site: str | None = None
    job_id: str | None = None
    refill: bool = False
    wait: float | None = None  # seconds; None with no site means no work at all
    #: With a job from ``next``: seconds until another of the worker's sites is due (PICK_SITE's
    #: next one, or this one again), as far as the ready set knows now; None if not known.
    quiet_for: float | None = None
    #: With a job: seconds until its site is due again (NEXT_JOB's re-score).
    again: float | None = None
    #: With a job: its RQ hash as NEXT_JOB read it (empty: gone), for ``joblife.fetch``.
    job_hash: dict[bytes, bytes] | None = None


class Scheduler:
    """Client side of the scheduling scripts (``crawler/lua``), for one worker (or one command)."""

    def __init__(self, connection: Redis, sites: Sequence[str] = (), lease: float = DEFAULT_JOB_LEASE):
        """``lease``: the jobs' lease (``job_lease``), after which the reaper first looks at a job handed out."""
        self.connection = connection
        self.sites = sorted(set(sites))
        self.group = keys.group(self.sites) if self.sites else ""
        if self.sites:  # the same list always names the same set, so writing it again is harmless
            connection.sadd(self.group, *self.sites)
        self._pick = lua.script(connection, "pick_site")
        self._next = lua.script(connection, "next_job")
        self._promote = lua.script(connection, "promote_due")
        self._due = lua.script(connection, "due_members")
        self._schedule = lua.script(connection, "schedule")
        self._close = lua.script(connection, "close_gate")
        self._batch_over = lua.script(connection, "batch_over")
        self._evict = lua.script(connection, "evict")
        self._forget_empty = lua.script(connection, "forget_empty_levels")
        self._pick_keys = [keys.ready(), self.group] if self.group else [keys.ready()]
        self._pick_args = [int(PREPARE_AHEAD * 1000)]
        self._site_keys: dict[str, list[str]] = {}
        self._lease_ms = int(lease * 1000)
        #: The gate each site's conf was last seen to name (a shared one), per site.
        self._gates: dict[str, str | bytes] = {}
        #: Until when (monotonic) no retry or refresh is due, as far as this process knows (``may_have_due``).
        self._none_due_until = 0.0

    def next(self) -> Next:
        """One job id of the next due site whose gate is open: PICK_SITE, then NEXT_JOB.

        Two round trips a job; a site found not ready to serve (gate closed, paused, at its
        cap, without work) is re-scored by NEXT_JOB and the next one is picked, up to
        MAX_TRIES sites. A site picked again in the same look is not taken twice: the
        worker is told to look again in RETRY_SOON. A scheduler of one site has nothing to
        pick: one round trip (NEXT_JOB, which answers with the site's wait too).
        """
        if len(self.sites) == 1:
            only = self.next_of(self.sites[0])
            return dataclasses.replace(only, quiet_for=only.again)
        tried: set[str] = set()
        for _ in range(MAX_TRIES):
            reply = self._pick(keys=self._pick_keys, args=self._pick_args)
            code = int(reply[0])
            if code == -1:
                return Next()
            if code == 0:
                return Next(wait=int(reply[1]) / 1000.0)
            site = text(reply[1])
            if site in tried:  # re-scored a moment ago, and due again already (a very short interval)
                return Next(wait=RETRY_SOON)
            tried.add(site)
            step = self.take(site)
            if step is not None:
                return dataclasses.replace(step, quiet_for=_quiet_for(step.again, int(reply[2])))
        return Next(wait=0.0)

    def take(self, site: str) -> Next | None:
        """One job id of ``site`` if it is due and its gate opens soon (NEXT_JOB), else None; ``Next(site,
        refill=True)`` without a job: its RQ queue is empty but its frontier is not (refill, take again)."""
        step = self.next_of(site)
        return step if step.site is not None else None

    def next_of(self, site: str, ahead: float = PREPARE_AHEAD) -> Next:
        """NEXT_JOB for ``site``: a job or a refill (``site`` set), else when to look again (``wait``: when
        its gate is within ``ahead`` of opening) or nothing (no ``wait``: the site has no work)."""
        for _ in range(2):  # a second time when the site's conf names a gate not known here
            site_keys = self._site_keys.get(site) or self._keys_of(site)
            gate = self._gates.get(site)
            args: list[str | int] = [site, REFILL_BELOW, int(ahead * 1000), int(REFILL_HOLD * 1000), self._lease_ms]
            reply = self._next(keys=[*site_keys, gate] if gate else site_keys, args=[*args, JOB_PREFIX])
            code = int(reply[0])
            if code == 1:
                fields = reply[4]
                return Next(
                    site=site,
                    job_id=text(reply[1]),
                    refill=bool(int(reply[2])),
                    again=int(reply[3]) / 1000,
                    job_hash=dict(zip(fields[::2], fields[1::2], strict=True)),
                )
            if code == 2:
                return Next(site=site, refill=True)
            if code == 0:
                return Next(wait=int(reply[1]) / 1000.0)
            if code == -1:
                return Next()
            named = text(reply[1])  # a key that is not UTF-8 (written by hand) goes back as sent, not altered
            self._gates[site] = named if "\ufffd" not in named else reply[1]
        return Next(wait=0.0)  # the conf names yet another gate: look again

    def _keys_of(self, site: str) -> list[str]:
        """NEXT_JOB's KEYS but the shared gate: the ready set and ``site``'s keys, RQ's from RQ's classes."""
        queue = Queue(keys.download_queue(site), connection=self.connection)
        found = self._site_keys[site] = [
            keys.ready(),
            keys.conf(site),
            keys.levels(site),
            keys.queued(site),
            queue.key,
            queue.intermediate_queue_key,
            queue.started_job_registry.key,
            keys.gate(site),
            keys.claims(),
            keys.drained(),
        ]
        return found

    def promote_due(self, limit: int = 100) -> int:
        """Move retries and refreshes that have come due back to their frontiers. Returns how many.

        One call (DUE_MEMBERS of both sets) when none is due; then one PROMOTE_DUE per set
        that has some, with every member's site keys in KEYS. Direct calls, not a pipeline:
        redis-py asks whether the scripts are loaded before every pipeline that runs one.
        """
        sets = ((keys.delayed(), "delayed", "delayed"), (keys.recrawls(), "recrawl", "recrawls"))
        *found, soonest_ms = self._due(keys=[key for key, _, _ in sets], args=[limit])
        wait = PROMOTE_LOOKS_MOST if int(soonest_ms) < 0 else min(PROMOTE_LOOKS_MOST, int(soonest_ms) / 1000)
        self._none_due_until = time.monotonic() + wait
        moved = 0
        for (key, what, counter), members in zip(sets, found, strict=True):
            if not members:
                continue
            promote_keys = [key, keys.ready(), keys.quarantine()]
            args: list[str | bytes | int] = [what, counter, keys.wake()]
            for member in members:
                parsed = parse_member(member)
                args += [member, len(promote_keys) + 1 if parsed else 0]
                if parsed:
                    site, priority = parsed
                    promote_keys += [keys.frontier(site, priority), keys.levels(site), keys.stats(site)]
            moved += int(self._promote(keys=promote_keys, args=args))
        return moved

    def may_have_due(self) -> bool:
        """Whether a ``promote_due`` now may find something: not before the first retry or refresh the last
        one saw waiting is due, nor any of this scheduler's since, and at least every PROMOTE_LOOKS_MOST s
        (those another process scheduled meanwhile)."""
        return time.monotonic() >= self._none_due_until

    def _due_in(self, delay: float) -> None:
        self._none_due_until = min(self._none_due_until, time.monotonic() + delay)

    def schedule(self, site: str, entry: str, delay: float, priority: int = 0) -> None:
        """Put ``entry`` back in ``site``'s frontier (at ``priority``) after ``delay`` seconds."""
        self._due_in(delay)
        member = f"{site}\t{priority}\t{secrets.token_hex(4)}\t{entry}"
        self._schedule(keys=[keys.delayed(), keys.stats(site)], args=[member, max(0, int(delay * 1000)), "delayed"])

    def schedule_refresh(self, site: str, entry: str, delay: float, priority: int) -> None:
        """Fetch ``entry``'s page again in ``delay`` seconds, whatever the seen set says; one page has one
        refresh pending: scheduling the same entry again moves it in time."""
        self._due_in(delay)
        member = f"{site}\t{priority}\t-\t{entry}"
        self._schedule(keys=[keys.recrawls(), keys.stats(site)], args=[member, max(0, int(delay * 1000)), "recrawls"])

    def evict(self, site: str, queue_key: str, job_id: str, priority: int, entries: Sequence[str]) -> bool:
        """Hand a queued job of ``site`` (its ``entries``, in order) back to its frontier; False if it was taken."""
        evicted = [keys.queued(site), queue_key, keys.frontier(site, priority), keys.levels(site), Job.key_for(job_id)]
        return bool(self._evict(keys=evicted, args=[job_id, priority, *entries]))

    def forget_empty_levels(self, site: str, priorities: Sequence[int]) -> None:
        """Drop the priorities of ``site`` whose frontier list is empty from its levels set."""
        if priorities:
            lists = [keys.frontier(site, p) for p in priorities]
            self._forget_empty(keys=[keys.levels(site), *lists], args=list(priorities))

    def close_gate(self, site: str, seconds: float, why: str = "", gate_key: str | None = None) -> None:
        """Keep every worker away from ``site`` for at least ``seconds``; ``why`` is shown by ``crawler status``.

        ``gate_key``: the gate the request took, when not the site's own (a shared gate).
        A closure that lengthens the gate's is noted in the site's conf (``closed_until``, ms
        on the Redis clock, and ``closed_why``), and a site due sooner in the ready set is
        re-scored to its end (two round trips: the gate, then the site's conf and the ready set,
        each key in its own slot; a worker handed the site in between finds the gate closed).
        """
        gate = gate_key or keys.gate(site)
        until, lengthened = self._close(keys=[gate], args=[secrets.token_hex(8), max(1, int(seconds * 1000))])
        with self.connection.pipeline(transaction=False) as pipe:
            if int(lengthened):
                pipe.hset(keys.conf(site), mapping={"closed_until": int(until), "closed_why": why})
            pipe.zadd(keys.ready(), {site: int(until)}, xx=True, gt=True)
            pipe.execute()

    def batch_over(self, site: str) -> None:
        """A paced batch of ``site`` is over (``batch_over``)."""
        batch_over(self.connection, site)

    def batch_over_in(self, pipe: Any, site: str) -> Callable[[], None]:
        """``batch_over`` queued in ``pipe`` (a transaction, or not); what runs it on its own instead, for a
        reply of NoScriptError (a Redis restarted: EVALSHA, since redis-py asks whether a ``Script`` is
        loaded before every pipeline that runs one). A download job's finish carries it (``joblife.finish``)."""
        pipe.evalsha(self._batch_over.sha, 2, keys.ready(), keys.gate(site), site)
        return lambda: self.batch_over(site)


def _quiet_for(again: float | None, after_ms: int) -> float | None:
    """``Next.quiet_for`` of a job picked by PICK_SITE: the sooner of its site's re-score (``again``)
    and the next site's (``after_ms``: -1 none, -2 not known)."""
    if again is None or after_ms == -2:
        return None
    return max(0.0, again if after_ms == -1 else min(again, after_ms / 1000))


def batch_over(connection: Redis, site: str) -> None:
    """A paced batch of ``site`` is over, or its job was handed back: the site is due again when its own
    gate opens, if that is sooner than NEXT_JOB had it (held for the batch's whole span). Nothing if it
    left the ready set."""
    lua.script(connection, "batch_over")(keys=[keys.ready(), keys.gate(site)], args=[site])


def mark_ready(connection: Redis, sites: Mapping[str, float]) -> None:
    """Add ``sites`` (name: ready-set score, ms) to the ready set unless there, announcing each one added.

    Every write that gives a site without work some marks it ready; one that was not in the
    ready set is announced on ``keys.wake()`` so that idle download workers, asleep until
    their next look, look at once (``work.listener``). A site already there costs nothing more.
    """
    if not sites:
        return
    with connection.pipeline(transaction=False) as pipe:
        for site, score in sites.items():
            pipe.zadd(keys.ready(), {site: score}, nx=True)
        added = pipe.execute()
    announce_work(connection, [site for site, new in zip(sites, added, strict=True) if new])


def announce_work(connection: Redis, sites: Sequence[str]) -> None:
    """Say on ``keys.wake()`` that ``sites`` were just added to the ready set (one PUBLISH a site)."""
    if not sites:
        return
    with connection.pipeline(transaction=False) as pipe:
        for site in sites:
            pipe.publish(keys.wake(), site)
        pipe.execute()


def parse_member(member: bytes) -> tuple[str, int] | None:
    """The site and priority of a retries or refreshes member (``site\tpriority\tnonce\tentry``).

    None for one this crawler did not write: fewer fields, no site, or a priority that is
    not an integer written plainly (``5``, ``-3``; not ``05``, ``1e3`` or beyond 2**53).
    """
    fields = member.split(b"\t", 3)
    if len(fields) < 4 or not fields[0] or not is_priority(fields[1]):
        return None
    try:
        return fields[0].decode(), int(fields[1])
    except UnicodeDecodeError:
        return None


#: A priority as ``schedule`` and the frontier's pushes write it.
_PRIORITY = re.compile(rb"0|-?[1-9][0-9]{0,14}")


def is_priority(raw: object) -> bool:
    """Whether ``raw`` (a reply from Redis) is a priority as the crawler writes it: an integer, plainly written."""
    if isinstance(raw, str):
        raw = raw.encode()
    return isinstance(raw, bytes) and bool(_PRIORITY.fullmatch(raw))


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
    batch: int = 1,
    pipe: Any = None,
) -> None:
    """Write the politeness NEXT_JOB obeys for ``site`` (interval incl. margin, margin, pause, cap).

    ``auto``: the interval is adaptive (its pace, kept in the same hash, applies); a fixed
    one drops any pace left from an adaptive one. ``gate_key``: the key of a gate shared
    by name (None: the site's own). ``gate_by_ip``: the gate is the address's, which the
    download workers write as they resolve it (left as it is here). ``batch``: URLs a job of
    the site carries that one thread fetches in turn, waiting on the gate between them (a slow
    site's paced batch): NEXT_JOB holds the site out of other picks for as many intervals.
    ``pipe``: a transaction to queue the writes in, for its caller to send (many sites' in one
    round trip); None: written now, in a transaction of their own.
    """
    mapping: dict[str, str | int] = {
        "interval_ms": max(1, round((interval + margin) * 1000)),
        "margin_ms": round(margin * 1000),
        "paused": "1" if paused else "0",
    }
    gone: list[str] = []
    for name, value in (("concurrency", concurrency or 0), ("batch", batch if batch > 1 else 0)):
        if value:
            mapping[name] = value
        else:
            gone.append(name)
    if not auto:
        gone += ["pace_ms", "pace_why"]
    if gate_key:
        mapping["gate"] = gate_key
    elif not gate_by_ip:
        gone.append("gate")
    # One HSET and one HDEL: every process writes each site's conf every REPUBLISH_EVERY.
    if pipe is not None:
        _queue_conf(pipe, site, mapping, gone)
        return
    with connection.pipeline(transaction=True) as own:
        _queue_conf(own, site, mapping, gone)
        own.execute()


def _queue_conf(pipe: Any, site: str, mapping: dict[str, str | int], gone: list[str]) -> None:
    pipe.hset(keys.conf(site), mapping=mapping)
    if gone:
        pipe.hdel(keys.conf(site), *gone)


def frontier_sizes(connection: Redis, sites: Sequence[str]) -> list[int]:
    """Entries waiting in each site's frontier (every priority), exactly, as of one moment per site.

    The sites' priorities are read (one pipeline), then counted by one FRONTIER_SIZE call
    a site (pipelined), which takes every list in KEYS and answers only if the
    priorities are still those read; a site whose priorities changed in between is read
    again. One that keeps changing has work moving through it: it counts as 1 at least.
    """
    sizes = [0] * len(sites)
    pending = list(range(len(sites)))
    size = lua.script(connection, "frontier_size")
    for _ in range(FRONTIER_SIZE_TRIES):
        if not pending:
            break
        with connection.pipeline(transaction=False) as pipe:
            for index in pending:
                pipe.zrange(keys.levels(sites[index]), 0, -1)
            levels = [[text(priority) for priority in found] for found in pipe.execute()]
        with connection.pipeline(transaction=False) as pipe:
            for index, priorities in zip(pending, levels, strict=True):
                # A priority that is not an integer was not written by a push: it names no list.
                lists = [keys.frontier(sites[index], int(p)) for p in priorities if is_priority(p)]
                size(
                    keys=[keys.levels(sites[index]), keys.frontier_extra(sites[index]), *lists],
                    args=priorities,
                    client=pipe,
                )
            counts = [int(n) for n in pipe.execute()]
        for index, count in zip(pending, counts, strict=True):
            sizes[index] = count
        pending = [index for index, count in zip(pending, counts, strict=True) if count < 0]
    for index in pending:
        sizes[index] = 1
    return sizes
