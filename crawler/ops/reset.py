"""Forgetting a site's crawl so it can start over: ``crawler reset`` and ``crawl --fresh``.

A reset drops what Redis holds about the site's progress: queued URLs (the compact
frontier, its RQ jobs, retries and refreshes waiting), the seen set, the counters, the
spider arguments (``crawl -a``), the ``<lastmod>`` its sitemaps gave each URL, and the
site's cookie jar and login session (the fresh crawl logs in again).
It keeps what was crawled and how the site is crawled: items and fetch records in the
database, robots.txt, the live settings and the pause. Jobs a worker already holds
finish, and pages already downloaded (in the pages stream) are parsed; their links then
enter a frontier that no longer remembers the old crawl. Counts a worker made before the
reset and had not yet written are dropped, not added to the fresh counters (``counters``).
"""

from __future__ import annotations

from dataclasses import dataclass

from redis import Redis

from ..coord import counters, keys
from ..coord.changes import announce
from ..coord.replies import text
from ..coord.scheduler import frontier_sizes, is_priority
from ..coord.seen import stored
from ..work.drain import queues_for


@dataclass(frozen=True)
class ResetResult:
    """What a reset forgot, and the downloads still in flight when it ran."""

    queued: int
    seen: int
    in_flight: int


def reset_site(connection: Redis, site: str) -> ResetResult:
    """Forget ``site``'s queued URLs, seen set and counters (see the module docstring)."""
    (queue,) = queues_for(connection, [keys.download_queue(site)])
    # A priority written by hand (not an integer) names no list; the levels set goes anyway.
    levels = [int(text(p)) for p in connection.zrange(keys.levels(site), 0, -1) if is_priority(p)]
    queued = sum(frontier_sizes(connection, [site])) + int(connection.llen(queue.key))
    # The seen table, its sub-sets, the time buckets of ``revisit_after``, the sets of before tables.
    seen_keys, seen = stored(connection, site)
    in_flight = int(connection.zcard(queue.started_job_registry.key)) + int(
        connection.llen(queue.intermediate_queue_key)
    )
    prefix = f"{site}\t"
    waiting = {
        name: [text(m) for m in connection.zrange(name, 0, -1) if text(m).startswith(prefix)]
        for name in (keys.delayed(), keys.recrawls())
    }
    queued += len(waiting[keys.delayed()])
    queue.empty()  # RQ's own script: the queued jobs and their hashes
    with connection.pipeline(transaction=True) as pipe:
        pipe.delete(
            *seen_keys,
            keys.admitted(site),
            keys.errors(site),
            keys.levels(site),
            keys.queued(site),
            keys.spider_args(site),
            *(keys.frontier(site, p) for p in {0, *levels}),
            keys.frontier_extra(site),
            keys.cookies(site),  # a fresh crawl starts with an empty jar, and logs in again
            keys.session(site),
            # The sitemaps' <lastmod> of each URL: a fresh crawl takes them as new, not as "not newer".
            keys.lastmod(site),
        )
        counters.forget(pipe, site)  # and counts a worker made before, not yet written, never will be
        pipe.zrem(keys.ready(), site)
        for name, members in waiting.items():
            if members:
                pipe.zrem(name, *members)
        pipe.execute()
    announce(connection)  # the spider arguments are gone: workers build the spider without them
    return ResetResult(queued=queued, seen=seen, in_flight=in_flight)
