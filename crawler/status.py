"""Per-site crawl status from Redis: queued, in flight, scheduled, done, failed, rate."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from redis import Redis

from . import keys
from .scheduler import frontier_sizes
from .workers import queues_for


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


def known_sites(connection: Redis) -> list[str]:
    """Sites that have ever been seeded on this Redis."""
    return sorted(s.decode() for s in connection.smembers(keys.sites()))


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
        queued, moving, started, _, raw = replies[5 * i: 5 * i + 5]
        stats = {k.decode(): int(v) for k, v in raw.items()}
        result.append(SiteStatus(
            site=site, queued=int(compact) + int(queued), in_flight=int(moving) + int(started),
            scheduled=stats.get("delayed", 0),
            fetched=stats.get("fetched", 0), parsed=stats.get("parsed", 0), failed=stats.get("failed", 0),
            refused=stats.get("refused", 0), items=stats.get("items", 0), refreshes=stats.get("recrawls", 0),
        ))
    return result


@dataclass
class ParseBacklog:
    """Parse jobs of every site: waiting in the RQ queue ``parse``, and being run."""

    queued: int
    in_flight: int


def parse_backlog(connection: Redis) -> ParseBacklog:
    """The parse queue's depth and jobs in flight, in one round trip."""
    (queue,) = queues_for(connection, [keys.PARSE_QUEUE])
    with connection.pipeline(transaction=False) as pipe:
        pipe.llen(queue.key)
        pipe.llen(queue.intermediate_queue_key)
        pipe.zcard(queue.started_job_registry.key)
        queued, moving, started = (int(n) for n in pipe.execute())
    return ParseBacklog(queued, moving + started)


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
    """Live RQ workers per host, counted by state (busy, idle, …), from RQ's worker registry."""
    from rq import Worker

    hosts: dict[str, dict[str, int]] = {}
    for worker in Worker.all(connection=connection):
        host = worker.hostname or "?"
        state = str(worker.get_state())
        hosts.setdefault(host, {}).setdefault(state, 0)
        hosts[host][state] += 1
    return hosts
