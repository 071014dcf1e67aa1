"""Download and parse workers: in-process RQ workers, gate-aware queue choice, drain.

Both are ``rq.SimpleWorker`` subclasses (jobs run in the worker's own process and
thread, so the HTTP pool and database engine live across jobs) that keep RQ's
registries, heartbeats and failure records. The download worker picks, on each
dequeue, a site that has work *and* whose gate is open, so it never sits behind one
closed gate while another site has budget; when every gate with work is closed it
sleeps exactly until the first one opens.

``--burst`` means: exit when the whole crawl is drained (nothing queued, started or
scheduled for the download queues served and the parse queue), not when one queue
is momentarily empty.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from redis import Redis
from rq import Queue, SimpleWorker
from rq.job import Job
from rq.registry import ScheduledJobRegistry
from rq.serializers import JSONSerializer
from rq.timeouts import TimerDeathPenalty
from rq.utils import current_timestamp

from . import keys, runtime
from .gate import Gate

log = logging.getLogger("crawler.workers")

#: Longest sleep when there is no work, so new work and stop requests are seen soon.
IDLE_SLEEP = 0.1
#: Seconds between two looks for retries that have come due.
PROMOTE_EVERY = 0.5


def queues_for(connection: Redis, names: Iterable[str]) -> list[Queue]:
    return [Queue(name, connection=connection, serializer=JSONSerializer) for name in names]


def pending_jobs(connection: Redis, queue_names: Iterable[str]) -> int:
    """Jobs queued, being moved, started or scheduled on the named queues."""
    queues = queues_for(connection, queue_names)
    with connection.pipeline(transaction=False) as pipe:
        for queue in queues:
            pipe.llen(queue.key)
            pipe.llen(queue.intermediate_queue_key)
            pipe.zcard(queue.started_job_registry.key)
            pipe.zcard(queue.scheduled_job_registry.key)
        return sum(int(n) for n in pipe.execute())


def crawl_drained(connection: Redis, sites: Iterable[str]) -> bool:
    """Whether nothing is left to do for ``sites``: downloads and every parse job.

    Checked twice a moment apart, so a job passing between two lists is not missed.
    """
    names = [keys.download_queue(site) for site in sites] + [keys.PARSE_QUEUE]
    if pending_jobs(connection, names):
        return False
    time.sleep(0.05)
    return pending_jobs(connection, names) == 0


def promote_due_retries(connection: Redis, queue: Queue) -> int:
    """Move ``queue``'s scheduled jobs that are due into the queue. Returns how many.

    A short lock makes one worker at a time do it, so no job is enqueued twice.
    """
    registry = ScheduledJobRegistry(queue=queue, serializer=JSONSerializer)
    job_ids = registry.get_jobs_to_schedule(current_timestamp())
    if not job_ids:
        return 0
    lock = Gate(connection, queue.name, expire=5, auto_release=True, namespace=keys.PREFIX + "lock:promote")
    if not lock.acquire(blocking=False):
        return 0
    try:
        job_ids = registry.get_jobs_to_schedule(current_timestamp())
        jobs = Job.fetch_many(job_ids, connection=connection, serializer=JSONSerializer)
        with connection.pipeline() as pipe:
            for job_id, job in zip(job_ids, jobs):
                if job is not None:
                    queue._enqueue_job(job, pipeline=pipe)
                registry.remove(job_id, pipeline=pipe)
            pipe.execute()
        return len(job_ids)
    finally:
        lock.release()


class CrawlWorker(SimpleWorker):
    """Shared behaviour: JSON jobs, thread-safe timeouts, drain-aware burst, stop event."""

    death_penalty_class = TimerDeathPenalty  # SIGALRM works only in a process's main thread

    def __init__(self, queues: Sequence[Queue], connection: Redis, sites: Sequence[str],
                 stop_event: threading.Event | None = None, **kwargs: Any):
        super().__init__(queues, connection=connection, serializer=JSONSerializer, **kwargs)
        self.sites = list(sites)
        self.stop_event = stop_event or threading.Event()
        self._burst = False
        self._last_promote = 0.0

    def work(self, burst: bool = False, **kwargs: Any) -> bool:  # type: ignore[override]
        self._burst = burst
        kwargs.setdefault("logging_level", logging.getLevelName(logging.getLogger("rq").getEffectiveLevel()))
        return super().work(burst=burst, **kwargs)

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            super()._install_signal_handlers()

    def request_stop(self, signum: Any, frame: Any) -> None:
        self.stop_event.set()
        super().request_stop(signum, frame)

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        # Jobs are always taken from one queue at a time (LMOVE into its intermediate
        # list), so they must always leave that list; RQ only does it for 1-queue workers.
        super().prepare_job_execution(job, remove_from_intermediate_queue=True)

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        self.set_state("idle")
        while not self.stop_event.is_set() and not self._stop_requested:
            self.heartbeat()
            if self.should_run_maintenance_tasks:
                self.run_maintenance_tasks()
            self._promote_retries()
            found, wait = self.next_job()
            if found is not None:
                return found
            if wait is None:  # no work anywhere we serve
                if self._burst and crawl_drained(self.connection, self.sites):
                    return None
                wait = IDLE_SLEEP
            self.stop_event.wait(min(wait, IDLE_SLEEP * 10))
        return None

    def _promote_retries(self) -> None:
        now = time.monotonic()
        if now - self._last_promote >= PROMOTE_EVERY:
            self._last_promote = now
            for queue in self.queues:
                promote_due_retries(self.connection, queue)

    def next_job(self) -> tuple[tuple[Job, Queue] | None, float | None]:
        """A job to run now, else how long until one may be ready (None: no work)."""
        for queue in self.queues:
            found = self._take(queue)
            if found is not None:
                return found, None
        return None, None

    def _take(self, queue: Queue) -> tuple[Job, Queue] | None:
        result = Queue.dequeue_any([queue], None, connection=self.connection,
                                   job_class=self.job_class, serializer=self.serializer)
        if result is not None:
            job, _ = result
            job.redis_server_version = self.get_redis_server_version()
            self.log.debug("Worker %s: %s: %s", self.name, queue.name, job.id)
        return result


class DownloadWorker(CrawlWorker):
    """Serves the download queues of ``sites``, always taking a site whose gate is open."""

    def __init__(self, connection: Redis, sites: Sequence[str], **kwargs: Any):
        queues = queues_for(connection, (keys.download_queue(s) for s in sites))
        super().__init__(queues, connection, sites, **kwargs)
        self._by_site = dict(zip(sites, queues))

    def next_job(self) -> tuple[tuple[Job, Queue] | None, float | None]:
        rt = runtime.current()
        with self.connection.pipeline(transaction=False) as pipe:
            for site, queue in self._by_site.items():
                pipe.llen(queue.key)
                pipe.pttl(keys.gate(site))
            replies = pipe.execute()
        open_sites, waits = [], []
        for i, site in enumerate(self._by_site):
            queued, pttl = int(replies[2 * i]), int(replies[2 * i + 1])
            if not queued or rt.policy(site).paused:
                continue
            if pttl <= 0:
                open_sites.append(site)
            else:
                waits.append(pttl / 1000.0)
        random.shuffle(open_sites)  # spread workers over the open sites
        for site in open_sites:
            found = self._take(self._by_site[site])
            if found is not None:
                return found, None
        if waits:
            return None, min(waits)
        return None, None


class ParseWorker(CrawlWorker):
    """Serves the parse queue; in burst mode waits until downloads of ``sites`` drain too."""

    def __init__(self, connection: Redis, sites: Sequence[str], **kwargs: Any):
        super().__init__(queues_for(connection, [keys.PARSE_QUEUE]), connection, sites, **kwargs)
