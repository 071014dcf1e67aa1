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

from ..coord import bulk, keys
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


#: What a look that found work saw first (``crawl_drained``'s ``seen``): processes with jobs in hand,
#: pages to parse or records to write, or work of sites (queued, or retries) waiting for their turn.
BUSY, PAGES, SITES = "busy", "pages", "sites"


def quick_work(connection: Redis, sites: Sequence[str], seen: list[str] | None = None) -> int:
    """Work found by a look of a constant number of commands, whatever the number of sites; 0: none seen.

    Pages to parse, records waiting for the database, the QUICK_SITES retries due soonest
    (those of ``sites``), and the first QUICK_SITES of ``sites`` in the ready set (one
    ZMSCORE) whose RQ queue or compact frontier holds entries. A count found here is real
    work; 0 proves nothing (running jobs, the retries of ``sites`` behind other sites'
    and sites missing from the ready set are not looked at): ``pending_work`` then reads
    every site. ``seen``: given, PAGES or SITES is appended to it when work is found.
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
        return _saw(seen, PAGES, found)
    found = _retries_of(replies[1], sites)
    if found:
        return _saw(seen, SITES, found)
    listed = [site for site, score in zip(sites, replies[0], strict=True) if score is not None][:QUICK_SITES]
    if not listed:
        return 0
    with connection.pipeline(transaction=False) as pipe:
        for site in listed:
            pipe.llen(Queue(keys.download_queue(site), connection=connection).key)
            pipe.zcard(keys.levels(site))
        return _saw(seen, SITES, sum(int(n or 0) for n in pipe.execute()))


def _saw(seen: list[str] | None, what: str, found: int) -> int:
    if found and seen is not None:
        seen.append(what)
    return found


def _retries_of(members: list[Any], sites: Sequence[str]) -> int:
    """How many of the retries ``members`` (``site\tpriority\tnonce\tentry``, a few) are of ``sites``."""
    named = [text(member).split("\t", 1)[0] for member in members]
    return sum(1 for site in named if site in sites)


def held_here(connection: Redis, sites: list[str]) -> list[str]:
    """Those of ``sites`` ever given work on this Redis: pushed to (``crawler:sites``), or with an RQ queue
    RQ registered (``rq:queues``: a job enqueued by another program too). The others have nothing to
    count here (a site on another shard, a spider never seeded). One round trip."""
    if not sites:
        return sites
    queues = [Queue.redis_queue_namespace_prefix + keys.download_queue(site) for site in sites]
    with connection.pipeline(transaction=False) as pipe:
        pipe.smismember(keys.sites(), sites)
        pipe.smismember(Queue.redis_queues_keys, queues)
        pushed, queued = pipe.execute()
    return [site for site, one, other in zip(sites, pushed, queued, strict=True) if one or other]


def _work_keys(queue: Queue) -> list[str]:
    """A site's RQ queue keys that hold its jobs: queued, being moved, started, scheduled."""
    return [
        queue.key,
        queue.intermediate_queue_key,
        queue.started_job_registry.key,
        queue.scheduled_job_registry.key,
    ]


def pending_work(connection: Redis, sites: Iterable[str], looked: bool = False, found: list[str] | None = None) -> int:
    """Whether anything is left for ``sites``: how much, or 0.

    Exact when it is 0, a lower bound otherwise. The cheap looks come first: the processes
    with jobs in hand (``inflight``), then ``quick_work`` (a constant number of commands);
    only when both see nothing is every site counted (``_count_every_site``).
    ``looked``: the caller has just made both cheap looks, which saw nothing. ``found``: given,
    the first site whose own work the count found is appended to it.
    """
    sites = list(sites)
    quick = 0 if looked else busy_processes(connection) or quick_work(connection, sites)
    if quick:
        return quick
    return _count_every_site(connection, held_here(connection, sites), found)


def _count_every_site(connection: Redis, sites: list[str], found: list[str] | None) -> int:
    """The work left of ``sites``, exact when 0: the fleet's records waiting, pages to parse and sites in
    transit, the retries waiting, then the sites' own keys (``bulk.any_exist``: a site with none of its
    RQ queue keys and no frontier priority has no job and no entry). Only the sites that name a key, or
    every site while some retry waits, are read one by one (``_work_of``): some ten commands for 2,000
    sites with nothing left."""
    queues = queues_for(connection, [keys.download_queue(site) for site in sites])
    with connection.pipeline(transaction=False) as pipe:
        outbox.count_waiting(pipe)  # records waiting for the database
        pipe.xlen(keys.pages())  # pages unread or being parsed: deleted once done with
        pipe.scard(keys.moving())  # sites in transit to or from this shard (``crawler move``): work left
        pipe.zcard(keys.delayed())  # retries waiting, of any site
        replies = [int(n or 0) for n in pipe.execute()]
    fleet, retries = sum(replies[:3]), replies[3] > 0
    named = bulk.any_exist(connection, [[*_work_keys(q), keys.levels(s)] for s, q in zip(sites, queues, strict=True)])
    busy = [i for i, name in enumerate(named) if name or retries]  # a retry may be another crawl's: each site asked
    if not busy:
        return fleet
    work = _work_of(connection, [sites[i] for i in busy], [queues[i] for i in busy], retries, [named[i] for i in busy])
    if found is not None:
        found += [sites[i] for i, n in zip(busy, work, strict=True) if n][:1]
    return fleet + sum(work)


def _work_of(connection: Redis, sites: list[str], queues: list[Queue], retries: bool, named: list[bool]) -> list[int]:
    """Each site's work left: its retries waiting (``retries``: some wait, of some site), its RQ jobs (a
    lower bound: one a key), and for a site with neither that ``named`` a key the entries in its
    frontier (its levels may name emptied lists for a while: counted, not taken for work)."""
    with connection.pipeline(transaction=False) as pipe:
        for site, queue in zip(sites, queues, strict=True):
            if retries:
                pipe.hget(keys.stats(site), "delayed")
            pipe.exists(*_work_keys(queue))
        replies = [int(n or 0) for n in pipe.execute()]
    step = 2 if retries else 1
    work = [sum(replies[i * step : (i + 1) * step]) for i in range(len(sites))]
    idle = [i for i, n in enumerate(work) if not n and named[i]]
    for i, size in zip(idle, frontier_sizes(connection, [sites[i] for i in idle]), strict=True):
        work[i] = size
    return work


#: Seconds for which an exact count's "drained" stands for the other burst processes of the fleet
#: (``keys.drained``), from its last use: each would otherwise count every site twice itself as the
#: crawl ends.
DRAINED_WORD_FOR = 2.0
#: What the word holds when a count found work: this, then the first site it found with some.
WORK_AT = "work at "
#: What the word holds while a process counts every site (its own word replaces it, or it lapses).
COUNTING = "counting"


def crawl_drained(
    connection: Redis,
    sites: Iterable[str],
    count_all: Callable[[], bool] | None = None,
    seen: list[str] | None = None,
) -> bool:
    """Whether nothing is left to do for ``sites``: downloads, retries, every page to parse.

    Checked twice a moment apart, so work passing between two lists is not missed; a burst's
    look (``count_all`` given) takes another process's such verdict of the last DRAINED_WORD_FOR
    seconds instead, once its cheap looks see nothing.
    ``count_all``: asked before a look reads every site (once the cheap looks saw nothing);
    False: not drained, as far as this look says, so a burst may look often while its
    every-site counts are made at the pace ``count_all`` sets. ``seen``: given, what a cheap look
    that found work saw first is appended to it (BUSY, PAGES or SITES).
    """
    sites = list(sites)
    if count_all is not None:
        if busy_processes(connection):
            _saw(seen, BUSY, 1)
            return False
        if quick_work(connection, sites, seen) or not count_all():
            return False
    # Another process's exact count found it drained a moment ago, no job was handed out since (NEXT_JOB
    # deletes the word), and the cheap looks see nothing: no process holds a job or has a page to parse.
    # Or it found work at a site: while that site has work, no count of every site is needed.
    group, word_ms = keys.group(sites), int(DRAINED_WORD_FOR * 1000)
    word = text(connection.get(keys.drained()) or b"") if count_all is not None else ""
    if word == group:
        # Still true, as far as the word's voiding goes: it stands longer, so the burst runs of a
        # process's drained shard, begun again while other shards finish, do not count it again.
        connection.pexpire(keys.drained(), word_ms)
        return True
    if word == COUNTING:  # another process is counting every site: its word comes within a moment
        return False
    hinted = word.removeprefix(WORK_AT)
    if word.startswith(WORK_AT) and hinted in sites and pending_work(connection, [hinted], looked=True):
        return False
    # Marked before counting: a job handed out while the count runs deletes the mark, and the word is
    # given only if the mark is still there (SET XX), so a count that missed a hand-out gives none.
    connection.set(keys.drained(), COUNTING, px=word_ms)
    found: list[str] = []
    if pending_work(connection, sites, looked=count_all is not None, found=found):
        if found:
            connection.set(keys.drained(), WORK_AT + found[0], px=word_ms)
        else:  # work of the whole fleet (pages, records waiting): the next look counts again
            connection.delete(keys.drained())
        return False
    time.sleep(0.05)
    if pending_work(connection, sites):
        connection.delete(keys.drained())
        return False
    connection.set(keys.drained(), group, px=word_ms, xx=True)
    return True
