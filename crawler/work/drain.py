"""Whether a crawl is drained: downloads queued or running, retries, pages to parse, records waiting.

Asked by burst workers before they stop, by ``crawler crawl`` before it ends, and by
``status``; exact when it answers "nothing left".
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from ..coord import keys
from ..coord.scheduler import frontier_sizes
from ..coord.vetting import CrawlerJob
from ..store import outbox


def queues_for(connection: Redis, names: Iterable[str]) -> list[Queue]:
    return [Queue(name, connection=connection, serializer=JSONSerializer, job_class=CrawlerJob) for name in names]


def _count_jobs(pipe: Any, queues: Iterable[Queue]) -> None:
    """Queue, in ``pipe``, the counts of jobs queued, being moved, started or scheduled on ``queues``."""
    for queue in queues:
        pipe.llen(queue.key)
        pipe.llen(queue.intermediate_queue_key)
        pipe.zcard(queue.started_job_registry.key)
        pipe.zcard(queue.scheduled_job_registry.key)


def pending_jobs(connection: Redis, queue_names: Iterable[str]) -> int:
    """Jobs queued, being moved, started or scheduled on the named queues."""
    with connection.pipeline(transaction=False) as pipe:
        _count_jobs(pipe, queues_for(connection, queue_names))
        return sum(int(n) for n in pipe.execute())


def pending_work(connection: Redis, sites: Iterable[str]) -> int:
    """Whether anything is left for ``sites``: how much, or 0.

    Delayed retries, RQ jobs, every page to parse and records waiting for the database
    are counted in one round trip; the compact frontiers (their levels, then a script a
    site: two more) only when those come to nothing. So the answer is exact when it is
    0, and a lower bound otherwise: an idle worker asks this often while a crawl runs.
    """
    sites = list(sites)
    with connection.pipeline(transaction=False) as pipe:
        for site in sites:
            pipe.hget(keys.stats(site), "delayed")
        outbox.count_waiting(pipe)  # records waiting for the database
        pipe.xlen(keys.pages())  # pages unread or being parsed: deleted once done with
        _count_jobs(pipe, queues_for(connection, [keys.download_queue(site) for site in sites]))
        waiting = sum(int(n or 0) for n in pipe.execute())
    return waiting or sum(frontier_sizes(connection, sites))


def crawl_drained(connection: Redis, sites: Iterable[str]) -> bool:
    """Whether nothing is left to do for ``sites``: downloads, retries, every page to parse.

    Checked twice a moment apart, so work passing between two lists is not missed.
    """
    sites = list(sites)
    if pending_work(connection, sites):
        return False
    time.sleep(0.05)
    return pending_work(connection, sites) == 0
