"""Many sites: dequeue throughput and Redis round trips per dequeue, 10, 1,000 and 10,000 sites.

What is measured: the download worker's dequeue path, driven directly in one client
(no HTTP): ``Scheduler.next()`` (``PICK_SITE``, then ``NEXT_JOB``), then ``Job.fetch``
of the job id it hands over, then ``Frontier.refill`` when the call asks for it, or
when it names a site whose RQ queue ran dry (then ``Scheduler.take`` of that site) --
exactly what ``DownloadWorker.next_job`` and ``execute_job`` do around a job. Every site
gets the same number of entries per dequeue in its compact frontier (``Frontier.push``), its RQ queue is pre-filled
(``refill(JOBS_AHEAD)``), and its interval is 1 ms (``publish_conf``), so the ready set
always has a due site and the figures are the scheduler's own cost, not politeness.

Two kinds of worker are measured: one serving every site with work (``crawler worker
download`` without ``--sites``: ``PICK_SITE`` reads the head of the ready set) and one
serving a list of sites (``--sites``, ``crawler crawl``, ``WorkerSpec`` with
``all_sites=False``: ``PICK_SITE`` walks the ready set to the first listed site).

Round trips are counted at the client (every packed send: one command or one
pipeline); Redis commands come from ``INFO commandstats`` deltas and include the
commands run inside Lua scripts. Each site count is measured ``REPEATS`` times,
alternating, and the median run is reported. Target: 10,000 sites at most 10% slower than 10.

For contrast, RQ's own multi-queue dequeue, ``Queue.dequeue_any`` (non-blocking, as in
burst mode) over 10 and 1,000 queues: once with jobs in every queue and the queue order
rotated after each dequeue as RQ's round-robin worker does (one LPOP), and once with
jobs only in the last queue (one LPOP per empty queue first).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from redis import Redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from crawler.coord import keys
from crawler.coord.frontier import DownloadTask, Frontier
from crawler.coord.scheduler import JOBS_AHEAD, Scheduler, publish_conf
from crawler.coord.vetting import DOWNLOAD_FUNC
from crawler.settings import DEFAULT_DOWNLOAD_TIMEOUT, DEFAULT_FAILURE_TTL

from .common import BenchRedis, BenchResult, Check, command_delta, command_stats, counting_client

#: Site counts compared.
SITE_COUNTS = (10, 1000, 10000)
#: Queue counts of the plain-RQ contrast (10,000 queues would take RQ minutes per run).
RQ_QUEUE_COUNTS = (10, 1000)
#: Dequeues per measured run (and the most seconds one run may take).
DEQUEUES = 5_000
QUICK_DEQUEUES = 3_000
RUN_SECONDS = 10.0
#: Runs per site count (alternating); the median is reported.
REPEATS = 3
QUICK_REPEATS = 1
#: Interval of every site: 1 ms, the smallest the scheduler stores.
INTERVAL = 0.001
#: RQ contrast: dequeues with every queue holding jobs, and with only the last one.
RQ_DEQUEUES = 5_000
RQ_SPARSE_DEQUEUES = 300
QUICK_RQ_DEQUEUES = 1_000
QUICK_RQ_SPARSE_DEQUEUES = 50
RQ_SECONDS = 10.0
#: Pushed in batches of this many entries.
BATCH = 5_000
#: Target: the 1,000-site throughput at least this fraction of the 10-site one.
TARGET = 0.90


def url_for(site: str, n: int) -> str:
    """An ~86-character product URL."""
    return f"https://www.{site[:12]}-shop.example.com/catalogue/kitchen/ceramic-mug-blue-{n:010d}/index.html"


def prepare_sites(connection: Redis, sites: list[str], per_site: int) -> dict[str, Frontier]:
    """Conf, compact entries and a pre-filled RQ queue for every site."""
    frontiers = {}
    for site in sites:
        publish_conf(connection, site, INTERVAL, 0.0)
        frontier = Frontier(connection, site, ["example.com"], DEFAULT_FAILURE_TTL, DEFAULT_DOWNLOAD_TIMEOUT)
        for start in range(0, per_site, BATCH):
            frontier.push([DownloadTask(site, url_for(site, n)) for n in range(start, min(per_site, start + BATCH))])
        frontier.refill(JOBS_AHEAD)
        frontiers[site] = frontier
    return frontiers


def measure_ours(url: str, frontiers_by_site: dict[str, Frontier], dequeues: int, served: list[str]) -> dict[str, Any]:
    """Run the worker's dequeue path ``dequeues`` times; throughput, round trips, commands.

    ``served`` empty: the scheduler picks among every site with work (a worker started
    without ``--sites``); else only among those listed (``--sites``, ``crawler crawl``).
    """
    client, trips = counting_client(url)
    frontiers = {
        site: Frontier(client, site, f.domains, f.failure_ttl, f.job_timeout) for site, f in frontiers_by_site.items()
    }
    scheduler = Scheduler(client, served)
    scheduler.next()  # load the scripts (SCRIPT LOAD + retry) outside the timing
    stats = command_stats(client)
    trips[0] = 0
    done = refills = waits = 0
    started = time.perf_counter()
    deadline = started + RUN_SECONDS
    step = scheduler.next()
    while done < dequeues and time.perf_counter() < deadline:
        if step.job_id is not None:
            Job.fetch(step.job_id, connection=client, serializer=JSONSerializer)
            done += 1
            if step.refill:
                frontiers[str(step.site)].refill(JOBS_AHEAD, due_now=True)
                refills += 1
        elif step.site is not None:  # as the worker does: refill, then that site's turn
            frontiers[step.site].refill(JOBS_AHEAD)
            refills += 1
            step = scheduler.take(step.site) or scheduler.next()
            continue
        elif step.wait is not None:
            waits += 1
            time.sleep(step.wait)
        else:
            break
        step = scheduler.next()
    elapsed = time.perf_counter() - started
    round_trips = trips[0]
    commands = command_delta(stats, command_stats(client))
    client.close()
    return {
        "dequeues": done,
        "seconds": elapsed,
        "rate": done / elapsed,
        "round_trips": round_trips / done,
        "commands": sum(commands.values()) / done,
        "evalsha": commands.get("evalsha", 0) / done,
        "refills": refills / done,
        "waits": waits,
    }


def measure_rq(url: str, names: list[str], dequeues: int, rotate: bool) -> dict[str, Any]:
    """RQ ``dequeue_any`` over ``names``; with ``rotate``, round-robin order as RQ's worker keeps it."""
    client, trips = counting_client(url)
    queues = [Queue(name, connection=client, serializer=JSONSerializer) for name in names]
    stats = command_stats(client)
    trips[0] = 0
    done = 0
    started = time.perf_counter()
    deadline = started + RQ_SECONDS
    while done < dequeues and time.perf_counter() < deadline:
        found = Queue.dequeue_any(queues, None, connection=client, serializer=JSONSerializer)
        if found is None:
            break
        done += 1
        if rotate:
            position = queues.index(found[1])
            queues = queues[position + 1 :] + queues[: position + 1]
    elapsed = time.perf_counter() - started
    round_trips = trips[0]
    commands = command_delta(stats, command_stats(client))
    client.close()
    return {
        "dequeues": done,
        "seconds": elapsed,
        "rate": done / elapsed if elapsed else 0.0,
        "round_trips": round_trips / max(done, 1),
        "commands": sum(commands.values()) / max(done, 1),
    }


def fill_rq(connection: Redis, names: list[str], per_queue: int) -> None:
    """``per_queue`` plain RQ download jobs in each named queue."""
    for name in names:
        queue = Queue(name, connection=connection, serializer=JSONSerializer)
        jobs = [
            Queue.prepare_data(
                DOWNLOAD_FUNC,
                args=(DownloadTask(name, url_for(name, n)).to_json(),),
                result_ttl=0,
                description=url_for(name, n),
            )
            for n in range(per_queue)
        ]
        with connection.pipeline() as pipe:
            queue.enqueue_many(jobs, pipeline=pipe)
            pipe.execute()


def drop_rq_jobs(connection: Redis, queue_names: list[str]) -> None:
    """Delete the RQ jobs (and lists) of ``queue_names``: cleanup on a Redis we do not own."""
    for name in queue_names:
        queue = Queue(name, connection=connection, serializer=JSONSerializer)
        ids = connection.lrange(queue.key, 0, -1) + connection.lrange(queue.intermediate_queue_key, 0, -1)
        with connection.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.delete(Job.key_for(job_id.decode() if isinstance(job_id, bytes) else str(job_id)))
            pipe.delete(queue.key, queue.intermediate_queue_key)
            pipe.execute()


@contextmanager
def own_namespace(redis: BenchRedis) -> Iterator[None]:
    """On a shared Redis, give the crawler's keys (ready set included) a prefix of this run's own."""
    if redis.owned:
        yield
        return
    saved = keys.PREFIX
    keys.PREFIX = f"crawler:{redis.tag}:"
    try:
        yield
    finally:
        keys.PREFIX = saved


def run(redis: BenchRedis, quick: bool = False) -> BenchResult:
    with own_namespace(redis):
        return _run(redis, quick)


def _run(redis: BenchRedis, quick: bool) -> BenchResult:
    dequeues = QUICK_DEQUEUES if quick else DEQUEUES
    repeats = QUICK_REPEATS if quick else REPEATS
    rq_dequeues = QUICK_RQ_DEQUEUES if quick else RQ_DEQUEUES
    rq_sparse = QUICK_RQ_SPARSE_DEQUEUES if quick else RQ_SPARSE_DEQUEUES
    result = BenchResult(
        "many_sites",
        {
            "site counts": SITE_COUNTS,
            "dequeues per run": dequeues,
            "runs per count (median)": repeats,
            "interval_s": INTERVAL,
            "JOBS_AHEAD": JOBS_AHEAD,
            "client": "1 process, 1 connection",
            "rq dequeues (all queues / last queue only)": f"{rq_dequeues} / {rq_sparse}",
        },
    )
    started = time.monotonic()
    modes = (("every site (no --sites)", False), ("the sites listed (--sites / crawl)", True))
    runs: dict[tuple[int, bool], list[dict[str, Any]]] = {(c, m): [] for c in SITE_COUNTS for _, m in modes}
    for _ in range(repeats):
        for count in SITE_COUNTS:
            redis.reset()
            sites = [f"ms{count}s{i}_{redis.tag}" for i in range(count)]
            per_site = len(modes) * dequeues // count + JOBS_AHEAD + 10
            frontiers = prepare_sites(redis.connection, sites, per_site)
            for _, listed in modes:
                runs[count, listed].append(measure_ours(redis.url, frontiers, dequeues, sites if listed else []))
            if not redis.owned:
                drop_rq_jobs(redis.connection, [keys.download_queue(site) for site in sites])
    rows = []
    medians: dict[tuple[int, bool], dict[str, Any]] = {}
    for label, listed in modes:
        for count in SITE_COUNTS:
            done = runs[count, listed]
            median = sorted(done, key=lambda r: r["rate"])[len(done) // 2]
            medians[count, listed] = median
            rows.append(
                [
                    f"crawler, {count} sites, serving {label}",
                    median["dequeues"],
                    median["rate"],
                    ", ".join(f"{r['rate']:.0f}" for r in done),
                    median["round_trips"],
                    median["commands"],
                    median["evalsha"],
                    median["refills"],
                    median["waits"],
                ]
            )
            print(
                f"  many_sites: {count} sites, {label}: {median['rate']:.0f} dequeues/s, "
                f"{median['round_trips']:.2f} round trips/dequeue",
                flush=True,
            )
    redis.reset()
    for count in RQ_QUEUE_COUNTS:
        names = [f"rq{count}q{i}_{redis.tag}" for i in range(count)]
        fill_rq(redis.connection, names, rq_dequeues // count + 1)
        full = measure_rq(redis.url, names, rq_dequeues, rotate=True)
        rows.append(
            [
                f"RQ dequeue_any, {count} queues, all with jobs",
                full["dequeues"],
                full["rate"],
                "-",
                full["round_trips"],
                full["commands"],
                None,
                None,
                None,
            ]
        )
        redis.reset()
        fill_rq(redis.connection, names[-1:], rq_sparse + 1)
        sparse = measure_rq(redis.url, names, rq_sparse, rotate=False)
        rows.append(
            [
                f"RQ dequeue_any, {count} queues, jobs in the last only",
                sparse["dequeues"],
                sparse["rate"],
                "-",
                sparse["round_trips"],
                sparse["commands"],
                None,
                None,
                None,
            ]
        )
        redis.reset()
        if not redis.owned:
            drop_rq_jobs(redis.connection, names)
        print(f"  many_sites: RQ {count} queues: {full['rate']:.0f} / {sparse['rate']:.0f} dequeues/s", flush=True)
    result.table(
        "dequeue path, one client",
        [
            "what",
            "dequeues",
            "dequeues/s",
            "runs (dequeues/s)",
            "round trips/dequeue",
            "Redis commands/dequeue",
            "EVALSHA/dequeue",
            "refills/dequeue",
            "waits",
        ],
        rows,
    )
    for label, listed in modes:
        few, many = medians[SITE_COUNTS[0], listed], medians[SITE_COUNTS[-1], listed]
        ratio = many["rate"] / few["rate"]
        result.checks.append(
            Check(
                f"{SITE_COUNTS[-1]} vs {SITE_COUNTS[0]} sites, serving {label}: dequeue throughput",
                f"{ratio:.3f}",
                f">= {TARGET}",
                ratio >= TARGET,
            )
        )
        result.checks.append(
            Check(
                f"round trips per dequeue, {SITE_COUNTS[0]} / {SITE_COUNTS[-1]} sites, {label}",
                f"{few['round_trips']:.2f} / {many['round_trips']:.2f}",
                "-",
                None,
            )
        )
    result.seconds = time.monotonic() - started
    return result
