"""Per-site crawl status from Redis: queued, in flight, scheduled, done, failed, rate."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from redis import Redis

from ..coord import keys, pages
from ..coord.pacing import conf_ms, read_pace
from ..coord.policy import SitePolicy, effective_interval
from ..coord.replies import text, text_map
from ..coord.scheduler import frontier_sizes
from ..work.drain import queues_for


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
        return asdict(self)


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
        gate_ttl, (seconds, micros) = pipe.execute()
    crawl_delay = (conf_ms(fields, "robots_delay_ms", site) or 0) / 1000.0  # one written by hand that does not hold: 0
    interval, why = effective_interval(policy, crawl_delay, read_pace(fields, site) if policy.auto else None)
    until = conf_ms(fields, "closed_until", site, most=10**16) or 0  # a time on the Redis clock, in ms
    left = until - (int(seconds) * 1000 + int(micros) // 1000)
    if left > 0 and int(gate_ttl) > 0:
        return Politeness(interval, why, min(left, int(gate_ttl)) / 1000.0, fields.get("closed_why") or "closed")
    return Politeness(interval, why)


def known_sites(connection: Redis) -> list[str]:
    """Sites that have ever been seeded on this Redis."""
    return sorted(text(s) for s in connection.smembers(keys.sites()))


def site_status(connection: Redis, sites: Iterable[str]) -> list[SiteStatus]:
    """Status of each site, read in one round trip."""
    sites = list(sites)
    queues = queues_for(connection, (keys.download_queue(s) for s in sites))
    with connection.pipeline(transaction=False) as pipe:
        for site, queue in zip(sites, queues, strict=True):
            pipe.llen(queue.key)
            pipe.llen(queue.intermediate_queue_key)
            pipe.zcard(queue.started_job_registry.key)
            pipe.zcard(queue.scheduled_job_registry.key)
            pipe.hgetall(keys.stats(site))
        replies = pipe.execute()
    result = []
    compacts = frontier_sizes(connection, sites)
    for i, site in enumerate(sites):
        compact = compacts[i]
        queued, moving, started, _, raw = replies[5 * i : 5 * i + 5]
        stats = {k.decode(): int(v) for k, v in raw.items()}
        result.append(
            SiteStatus(
                site=site,
                queued=int(compact) + int(queued),
                in_flight=int(moving) + int(started),
                scheduled=stats.get("delayed", 0),
                fetched=stats.get("fetched", 0),
                parsed=stats.get("parsed", 0),
                failed=stats.get("failed", 0),
                refused=stats.get("refused", 0),
                items=stats.get("items", 0),
                refreshes=stats.get("recrawls", 0),
                cache_hits=stats.get("cache_hits", 0),
                cache_misses=stats.get("cache_misses", 0),
            )
        )
    return result


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


def state(status: SiteStatus, suspended: bool = False) -> str:
    """``running``, ``paused`` (``crawler pause``), ``suspended`` (``rq suspend``: no worker takes a job),
    or ``closed 12s: backoff after 503`` (the site's gate closed for everyone, and why)."""
    if suspended:
        return "suspended"
    if status.paused:
        return "paused"
    return f"closed {status.closed_for:.0f}s: {status.closed_why}" if status.closed_for else "running"
