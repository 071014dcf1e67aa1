"""Whether a crawl is drained: downloads queued or running, retries, pages to parse, records waiting.

Asked by burst workers before they stop, by ``crawler crawl`` before it ends, and by
``status``; exact when it answers "nothing left".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from ..coord import keys
from ..coord.inflight import busy_processes
from ..coord.replies import text
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


#: Sites with work in the ready set whose queue and frontier the quick look reads.
QUICK_SITES = 3


def quick_work(connection: Redis, sites: Sequence[str]) -> int:
    """Work found by a look of a constant number of commands, whatever the number of sites; 0: none seen.

    Pages to parse, records waiting for the database, the QUICK_SITES retries due soonest
    (those of ``sites``), and the first QUICK_SITES of ``sites`` in the ready set (one
    ZMSCORE) whose RQ queue or compact frontier holds entries. A count found here is real
    work; 0 proves nothing (running jobs, the retries of ``sites`` behind other sites'
    and sites missing from the ready set are not looked at): ``pending_work`` then reads
    every site.
    """
    with connection.pipeline(transaction=False) as pipe:
        if sites:
            pipe.zmscore(keys.ready(), list(sites))
            # While only retries wait (a crawl's tail of sites answering 503), this look answers,
            # not an every-site count each DRAIN_EVERY.
            pipe.zrange(keys.delayed(), 0, QUICK_SITES - 1)
        outbox.count_waiting(pipe)
        pipe.xlen(keys.pages())
        replies = pipe.execute()
    found = int(replies[-1] or 0) + int(replies[-2] or 0)
    if found or not sites:
        return found
    found = _retries_of(replies[1], sites)
    if found:
        return found
    listed = [site for site, score in zip(sites, replies[0], strict=True) if score is not None][:QUICK_SITES]
    if not listed:
        return 0
    with connection.pipeline(transaction=False) as pipe:
        for site in listed:
            pipe.llen(Queue(keys.download_queue(site), connection=connection).key)
            pipe.zcard(keys.levels(site))
        return sum(int(n or 0) for n in pipe.execute())


def _retries_of(members: list[Any], sites: Sequence[str]) -> int:
    """How many of the retries ``members`` (``site\tpriority\tnonce\tentry``, a few) are of ``sites``."""
    named = [text(member).split("\t", 1)[0] for member in members]
    return sum(1 for site in named if site in sites)


def pending_work(connection: Redis, sites: Iterable[str], looked: bool = False) -> int:
    """Whether anything is left for ``sites``: how much, or 0.

    First one command: the download processes of the fleet with jobs in hand (``inflight``),
    which answers while any download runs (a burst's workers ask after every look that found
    no job to run now). Then the quick look (``quick_work``: at most 4 + 2 x QUICK_SITES
    commands in two round trips, however many sites): while a crawl has work queued, or
    retries waiting, it answers. Only when both see nothing are delayed retries, RQ
    jobs, every page to parse and records waiting for the database counted (one round
    trip, five commands a site), then the compact frontiers (their levels, then a script a
    site: two more) when those come to nothing: once at the end of a crawl, or while only
    retries of its sites wait behind other crawls' retries on the same Redis. So the answer
    is exact when it is 0, and a lower bound otherwise.
    ``looked``: the caller has just made the first command and the quick look, which saw nothing.
    """
    sites = list(sites)
    quick = 0 if looked else busy_processes(connection) or quick_work(connection, sites)
    if quick:
        return quick
    with connection.pipeline(transaction=False) as pipe:
        for site in sites:
            pipe.hget(keys.stats(site), "delayed")
        outbox.count_waiting(pipe)  # records waiting for the database
        pipe.xlen(keys.pages())  # pages unread or being parsed: deleted once done with
        _count_jobs(pipe, queues_for(connection, [keys.download_queue(site) for site in sites]))
        waiting = sum(int(n or 0) for n in pipe.execute())
    return waiting or sum(frontier_sizes(connection, sites))


def crawl_drained(connection: Redis, sites: Iterable[str], count_all: Callable[[], bool] | None = None) -> bool:
    """Whether nothing is left to do for ``sites``: downloads, retries, every page to parse.

    Checked twice a moment apart, so work passing between two lists is not missed.
    ``count_all``: asked before a look reads every site (``pending_work``, once the first
    few commands saw nothing); False: not drained, as far as this look says. So a burst may
    look often (its end comes as soon as its last page is parsed) while its every-site
    counts, five commands a site, are made at the pace ``count_all`` sets.
    """
    sites = list(sites)
    if count_all is not None and (busy_processes(connection) or quick_work(connection, sites) or not count_all()):
        return False
    if pending_work(connection, sites, looked=count_all is not None):
        return False
    time.sleep(0.05)
    return pending_work(connection, sites) == 0
