"""Per-site crawl status from Redis: queued, in flight, scheduled, done, failed, rate."""

from __future__ import annotations

import dataclasses
import json
import math
import operator
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any

from redis import Redis
from rq.intermediate_queue import IntermediateQueue
from rq.queue import Queue
from rq.registry import ScheduledJobRegistry, StartedJobRegistry

from ..coord import keys, pages
from ..coord.bulk import pairs, read_chunks, read_many
from ..coord.pacing import conf_ms, read_pace
from ..coord.policy import SitePolicy, effective_interval, resolve_policy
from ..coord.replies import text, text_map
from ..coord.scheduler import frontier_sizes
from ..settings import Settings
from ..spiders.spider import Spider

#: Sites one pipeline of the every-site reads takes (``site_status``, ``read_politeness``): a call
#: costs a few round trips a chunk of sites, however many there are, and no replies pile up past two
#: chunks' in Redis or here (``read_chunks``: one chunk in flight while the one before is read).
STATUS_CHUNK = 1000


@dataclass
class SiteStatus:
    """A snapshot of one site's crawl."""

    site: str
    queued: int
    in_flight: int
    scheduled: int
    fetched: int
    parsed: int
    failed: int
    refused: int
    items: int
    #: Pages with a scheduled refresh pending.
    refreshes: int = 0
    #: Downloads per second over the last minute, as observed (``crawler status``).
    rate: float | None = None
    interval: float | None = None
    interval_source: str | None = None  # spider | config | live
    paused: bool = False
    #: Downloads served by the development cache (no request sent), and those it had to send.
    cache_hits: int = 0
    cache_misses: int = 0
    #: Why the interval in force is what it is: the source, ``auto 2.4s (last 480 ms × 5)``, robots.txt.
    interval_why: str | None = None
    #: Seconds the site's gate stays closed for everyone (Retry-After, backoff), and why.
    closed_for: float | None = None
    closed_why: str | None = None

    @property
    def done(self) -> int:
        """Downloads finished for good: fetched, failed or refused."""
        return self.fetched + self.failed + self.refused

    @property
    def left(self) -> int:
        """Downloads still to do: queued, in flight, or waiting to be retried."""
        return self.queued + self.in_flight + self.scheduled

    def eta(self, rate: float | None) -> float | None:
        """Seconds until the work left is done at ``rate`` downloads per second; None if unknown."""
        if not self.left:
            return 0.0
        return self.left / rate if rate else None

    def as_dict(self) -> dict[str, Any]:
        """Every field by name, in their order (``dataclasses.asdict``'s dict: the values are all scalars)."""
        return {name: getattr(self, name) for name in _STATUS_FIELDS}


_STATUS_FIELDS = tuple(f.name for f in dataclasses.fields(SiteStatus))


def this_run(now: SiteStatus, before: SiteStatus | None) -> SiteStatus:
    """``now`` with its counters (fetched, parsed, items, failed, refused) counted since ``before``.

    A counter lower than before (the site was reset meanwhile) counts from zero.
    """
    if before is None:
        return now
    counted = {
        name: getattr(now, name) - getattr(before, name)
        if getattr(now, name) >= getattr(before, name)
        else getattr(now, name)
        for name in ("fetched", "parsed", "items", "failed", "refused", "cache_hits", "cache_misses")
    }
    return dataclasses.replace(now, **counted)


@dataclass(frozen=True)
class Politeness:
    """The interval in force for a site and why; a closure of its gate still running, and why."""

    interval: float
    why: str
    closed_for: float | None = None
    closed_why: str | None = None


def politeness(connection: Redis, site: str, policy: SitePolicy) -> Politeness:
    """What spaces ``site``'s requests now: ``effective_interval`` over the site's conf in Redis
    (robots.txt Crawl-delay, adaptive pace), and the rest of a closure of its gate."""
    fields = text_map(connection.hgetall(keys.conf(site)))
    with connection.pipeline(transaction=False) as pipe:
        pipe.pttl(fields.get("gate") or keys.gate(site))  # a shared gate's key, when it has one
        pipe.time()
        gate_ttl, now = pipe.execute()
    return _politeness_of(site, policy, fields, _closed_left(fields, site, now), int(gate_ttl))


def read_politeness(
    connection: Redis, spiders: Mapping[str, type[Spider]], settings: Settings
) -> dict[str, tuple[SitePolicy, Politeness]]:
    """For each site of ``spiders`` (site -> its spider): its policy in force (``resolve_policy``: spider
    < config < live settings) and ``politeness``, as ``politeness`` reads it.

    A round trip a STATUS_CHUNK of sites reads their live settings and confs, and the Redis clock
    (``read_chunks``: a chunk's policies made while Redis reads the next); only the sites whose gate a
    closure may still hold shut (``closed_until`` to come) cost one more, all together, for their gates'
    PTTLs (and the clock again): a fixed number of round trips, none a site.
    """
    sites = list(spiders)
    chunks = [sites[start : start + STATUS_CHUNK] for start in range(0, len(sites), STATUS_CHUNK)]
    policies: dict[str, SitePolicy] = {}
    confs: dict[str, dict[str, str]] = {}
    closing: list[str] = []
    for chunk, (*replies, now) in zip(chunks, read_chunks(connection, map(_politeness_reads, chunks)), strict=True):
        for i, site in enumerate(chunk):
            live = replies[2 * i]  # most sites have no live setting: no dict to make of it
            policies[site] = resolve_policy(spiders[site], settings, text_map(pairs(live)) if live else {})
            fields = confs[site] = _conf_fields(replies[2 * i + 1])
            if "closed_until" in fields and _closed_left(fields, site, now) > 0:
                closing.append(site)
    gate_ttls, later = _gate_ttls(connection, closing, confs) if closing else ({}, None)
    found: dict[str, tuple[SitePolicy, Politeness]] = {}
    for site in sites:
        policy, fields = policies[site], confs[site]
        left = _closed_left(fields, site, later) if site in gate_ttls else 0
        found[site] = (policy, _politeness_of(site, policy, fields, left, gate_ttls.get(site, 0)))
    return found


def _politeness_reads(sites: Sequence[str]) -> list[tuple[str, ...]]:
    """The reads of ``read_politeness`` for ``sites``: their live settings and confs, two a site, then the clock."""
    commands: list[tuple[str, ...]] = []
    for site in sites:
        commands += [("HGETALL", keys.live_settings(site)), ("HMGET", keys.conf(site), *_CONF_FIELDS)]
    commands.append(("TIME",))
    return commands


def _gate_ttls(
    connection: Redis, sites: Sequence[str], confs: Mapping[str, Mapping[str, str]]
) -> tuple[dict[str, int], Any]:
    """The PTTL of each site's gate (its shared gate's key, when it has one), and the Redis clock after them."""
    *ttls, now = read_many(
        connection, [*(("PTTL", confs[site].get("gate") or keys.gate(site)) for site in sites), ("TIME",)]
    )
    return {site: int(ttl) for site, ttl in zip(sites, ttls, strict=True)}, now


#: The fields of a site's conf that ``politeness`` reads (``_politeness_of``, ``_closed_left``, the gate's key).
_CONF_FIELDS = ("gate", "robots_delay_ms", "pace_ms", "pace_why", "closed_until", "closed_why")


def _conf_fields(reply: list[Any]) -> dict[str, str]:
    """The ``_CONF_FIELDS`` a site's conf holds, as text, of its HMGET's reply."""
    if reply.count(None) == len(_CONF_FIELDS):  # a site no worker has served yet: most, at 10,000 sites
        return {}
    return {name: text(value) for name, value in zip(_CONF_FIELDS, reply, strict=True) if value is not None}


def _closed_left(fields: Mapping[str, str], site: str, now: Any) -> int:
    """Milliseconds left of a closure of the site's gate (``closed_until`` in its conf ``fields``, a time on
    the Redis clock) at ``now`` (a TIME reply); 0 or less when none runs."""
    seconds, micros = now
    until = conf_ms(fields, "closed_until", site, most=10**16) or 0
    return until - (int(seconds) * 1000 + int(micros) // 1000)


def _politeness_of(site: str, policy: SitePolicy, fields: Mapping[str, str], left: int, gate_ttl: int) -> Politeness:
    """``politeness`` from the site's conf ``fields``, the ms ``left`` of a closure and its gate's PTTL."""
    crawl_delay = (conf_ms(fields, "robots_delay_ms", site) or 0) / 1000.0  # one written by hand that does not hold: 0
    interval, why = effective_interval(policy, crawl_delay, read_pace(fields, site) if policy.auto else None)
    if left > 0 and gate_ttl > 0:
        return Politeness(interval, why, min(left, gate_ttl) / 1000.0, fields.get("closed_why") or "closed")
    return Politeness(interval, why)


def known_sites(connection: Redis) -> list[str]:
    """Sites that have ever been seeded on this Redis."""
    return sorted(text(s) for s in connection.smembers(keys.sites()))


def queue_keys(site: str) -> tuple[str, str, str, str]:
    """The keys of ``site``'s RQ queue (``keys.download_queue``): the queue, its intermediate list (jobs being
    moved to a worker), its started and its scheduled registries; as RQ names them, no object made."""
    name = keys.download_queue(site)
    queue = Queue.redis_queue_namespace_prefix + name
    return (
        queue,
        IntermediateQueue.get_intermediate_queue_key(queue),
        StartedJobRegistry.key_template.format(name),
        ScheduledJobRegistry.key_template.format(name),
    )


def site_status(connection: Redis, sites: Iterable[str]) -> list[SiteStatus]:
    """Status of each site: a round trip a STATUS_CHUNK of sites for their counts (``read_chunks``: a chunk's
    statuses made while Redis reads the next), then the sizes of the frontiers that hold a priority, all at
    once (``frontier_sizes``: some four round trips; a frontier with no priority holds no entry); none a site."""
    sites = list(sites)
    chunks = [sites[start : start + STATUS_CHUNK] for start in range(0, len(sites), STATUS_CHUNK)]
    result: list[SiteStatus] = []
    waiting: list[SiteStatus] = []
    for chunk, replies in zip(chunks, read_chunks(connection, map(_status_reads, chunks)), strict=True):
        for i, site in enumerate(chunk):
            queued, moving, started, levels, stats = replies[5 * i : 5 * i + 5]
            status = _counted(site, int(queued), int(moving) + int(started), stats)
            result.append(status)
            if int(levels):
                waiting.append(status)
    if waiting:  # their frontiers' entries are queued too
        for status, size in zip(waiting, frontier_sizes(connection, [s.site for s in waiting]), strict=True):
            status.queued += size
    return result


def _status_reads(sites: Sequence[str]) -> list[tuple[str, ...]]:
    """The reads of ``site_status`` for ``sites``: five a site, in the order ``site_status`` takes their replies."""
    commands: list[tuple[str, ...]] = []
    for site in sites:
        queue, moving, started, _ = queue_keys(site)
        commands += [("LLEN", queue), ("LLEN", moving), ("ZCARD", started), ("ZCARD", keys.levels(site))]
        commands.append(("HMGET", keys.stats(site), *_STATS))
    return commands


def _counted(site: str, queued: int, in_flight: int, stats: list[Any]) -> SiteStatus:
    """A site's status of its queue's counts and its stats' HMGET (``_STATS``)."""
    counts = _NO_STATS if stats.count(None) == len(_STATS) else [int(n or 0) for n in stats]
    delayed, fetched, parsed, failed, refused, items, recrawls, hits, misses = counts
    return SiteStatus(
        site=site,
        queued=queued,
        in_flight=in_flight,
        scheduled=delayed,
        fetched=fetched,
        parsed=parsed,
        failed=failed,
        refused=refused,
        items=items,
        refreshes=recrawls,
        cache_hits=hits,
        cache_misses=misses,
    )


#: The fields of a site's stats (``keys.stats``) a ``SiteStatus`` shows, in the order ``site_status`` reads them.
_STATS = ("delayed", "fetched", "parsed", "failed", "refused", "items", "recrawls", "cache_hits", "cache_misses")
#: The counts of a site with no stats yet (seeded, not crawled).
_NO_STATS = (0,) * len(_STATS)


@dataclass
class ParseBacklog:
    """Pages of every site waiting in the pages stream: not yet read by a parse worker, and being parsed."""

    queued: int
    in_flight: int


def parse_backlog(connection: Redis) -> ParseBacklog:
    """The pages stream's unread and pending entries, in one round trip."""
    return ParseBacklog(*pages.backlog(connection))


class RateMeter:
    """Pages fetched per second per site, from successive snapshots."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}
        self.rates: dict[str, float] = {}

    def update(self, statuses: Iterable[SiteStatus]) -> None:
        now = time.monotonic()
        for status in statuses:
            done = status.fetched + status.failed + status.refused
            if status.site in self._last:
                then, before = self._last[status.site]
                if now - then >= 0.5:
                    self.rates[status.site] = (done - before) / (now - then)
                    self._last[status.site] = (now, done)
            else:
                self._last[status.site] = (now, done)


def workers_by_host(connection: Redis) -> dict[str, dict[str, int]]:
    """Live workers per host, counted by state (busy, idle, …).

    Download workers from RQ's worker registry; parse workers from their signs of life
    (``pages.live_consumers``), busy while they hold entries of the pages stream.
    """
    from rq import Worker

    hosts: dict[str, dict[str, int]] = {}

    def count(host: str, state: str) -> None:
        hosts.setdefault(host, {}).setdefault(state, 0)
        hosts[host][state] += 1

    for worker in Worker.all(connection=connection):
        count(worker.hostname or "?", str(worker.get_state()))
    for consumer in pages.live_consumers(connection):
        count(consumer.host, "busy" if consumer.pending else "idle")
    return hosts


def status_json(statuses: Sequence[SiteStatus], parsing: ParseBacklog, hosts: Any, suspended: bool) -> str:
    """``crawler status --json``: ``json.dumps`` of the sites (each with its ``state``), the parse backlog, the
    workers and the suspension, ``indent=2``, to the character; each site written by a template of its
    fields (``_site_json``), not by the json module's encoder in Python (0.15 s of 10,000 sites)."""
    rest = {"parse": dataclasses.asdict(parsing), "workers": hosts, "suspended": suspended}
    if not statuses:
        return json.dumps({"sites": [], **rest}, indent=2)
    others = json.dumps({"sites": [], **rest}, indent=2).removeprefix('{\n  "sites": [],')
    sites = ",\n".join(_site_json(s, suspended) for s in statuses)
    return '{\n  "sites": [\n' + sites + "\n  ]," + others


def _site_json(status: SiteStatus, suspended: bool) -> str:
    """A site of ``status_json``, as ``json.dumps`` writes it there (a scalar of an unusual type: by it)."""
    values = (*_status_values(status), state(status, suspended))
    try:
        return _SITE_JSON % tuple(_JSON_SCALARS[type(value)](value) for value in values)
    except KeyError:
        shown = json.dumps({**status.as_dict(), "state": values[-1]}, indent=2)
        return "\n".join("    " + line for line in shown.split("\n"))


def _float_json(value: float) -> str:
    """A float as the json module writes it (``allow_nan``)."""
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


#: How the json module writes each type of scalar (``ensure_ascii``), by exact type.
_JSON_SCALARS: dict[type, Callable[[Any], str]] = {
    str: encode_basestring_ascii,
    int: int.__repr__,
    float: _float_json,
    bool: lambda value: "true" if value else "false",
    type(None): lambda value: "null",
}
#: A site's fields in ``status_json``, and the text ``json.dumps(..., indent=2)`` makes of them there.
_status_values = operator.attrgetter(*_STATUS_FIELDS)
_SITE_JSON = (
    "    {\n"
    + ",\n".join(f"      {encode_basestring_ascii(name)}: %s" for name in (*_STATUS_FIELDS, "state"))
    + "\n    }"
)


def state(status: SiteStatus, suspended: bool = False) -> str:
    """``running``, ``paused`` (``crawler pause``), ``suspended`` (``rq suspend``: no worker takes a job),
    or ``closed 12s: backoff after 503`` (the site's gate closed for everyone, and why)."""
    if suspended:
        return "suspended"
    if status.paused:
        return "paused"
    return f"closed {status.closed_for:.0f}s: {status.closed_why}" if status.closed_for else "running"
