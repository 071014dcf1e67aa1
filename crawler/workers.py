"""Download and parse workers: in-process RQ workers, gate-aware queue choice, drain.

Both are ``rq.SimpleWorker`` subclasses (jobs run in the worker's own process and
thread, so the HTTP pool and database engine live across jobs) that keep RQ's
registries, heartbeats and failure records. The download worker asks the scheduler
(one Lua call, whatever the number of sites) for a site that has work *and* whose gate
is open, so it never sits behind one closed gate while another site has budget; when
every gate with work is closed it sleeps exactly until the first one opens.

``--burst`` means: exit when the whole crawl is drained (nothing queued, started or
scheduled for the download queues served and the parse queue), not when one queue
is momentarily empty.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import redis
from redis import Redis
from rq import Queue, SimpleWorker
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.timeouts import TimerDeathPenalty
from rq.utils import now

from . import keys, runtime
from .recovery import HEARTBEAT_EVERY, REAP_EVERY, prune_dead_executions, reap
from .scheduler import JOBS_AHEAD, Next, Scheduler, frontier_sizes

log = logging.getLogger("crawler.workers")

#: Longest sleep when there is no work, so new work and stop requests are seen soon.
IDLE_SLEEP = 0.1
#: Seconds between two looks for retries that have come due.
PROMOTE_EVERY = 0.2
#: Least seconds between two plain heartbeats of a worker (job heartbeats are separate).
WORKER_BEAT_EVERY = 5.0
#: Seconds between two idle looks for sites with work missing from the ready set.
REPAIR_EVERY = 1.0
#: Sites refilled in one dequeue before the worker loops back to its checks.
MAX_REFILLS = 8


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


def pending_work(connection: Redis, sites: Iterable[str]) -> int:
    """Everything left for ``sites``: compact frontiers, delayed retries, RQ jobs, parse jobs."""
    sites = list(sites)
    with connection.pipeline(transaction=False) as pipe:
        for site in sites:
            pipe.hget(keys.stats(site), "delayed")
        replies = pipe.execute()
    waiting = sum(int(n or 0) for n in replies) + sum(frontier_sizes(connection, sites))
    names = [keys.download_queue(site) for site in sites] + [keys.PARSE_QUEUE]
    return waiting + pending_jobs(connection, names)


def crawl_drained(connection: Redis, sites: Iterable[str]) -> bool:
    """Whether nothing is left to do for ``sites``: downloads, retries, every parse job.

    Checked twice a moment apart, so work passing between two lists is not missed.
    """
    sites = list(sites)
    if pending_work(connection, sites):
        return False
    time.sleep(0.05)
    return pending_work(connection, sites) == 0


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
        self._last_reap = 0.0
        self._redis_wait = 0.0

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
        while not self.stop_event.is_set() and not self._stop_requested:
            try:
                found, wait = self._dequeue_step()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                wait = self._redis_down(exc)
            else:
                self._redis_back()
                if found is not None:
                    return found
                if wait is None:  # drained
                    return None
            self.stop_event.wait(wait)
        return None

    def _dequeue_step(self) -> tuple[tuple[Job, Queue] | None, float | None]:
        """One look for work: a job, else seconds to wait (None: burst and drained)."""
        self.set_state("idle")
        self.heartbeat()
        if self.should_run_maintenance_tasks:
            self.run_maintenance_tasks()
        self._periodic()
        found, wait = self.next_job()
        if found is not None:
            return found, None
        if wait is None:  # no work anywhere we serve
            if self._burst and crawl_drained(self.connection, self.sites):
                return None, None
            self.when_idle()
            wait = IDLE_SLEEP
        return None, min(wait, IDLE_SLEEP * 10)

    def _redis_down(self, exc: Exception) -> float:
        """Log the first failure in one line; the wait before the next try (backoff to 30 s)."""
        if self._redis_wait == 0:
            self.log.error("Redis unreachable (%s): waiting and reconnecting", str(exc).splitlines()[0])
        self._redis_wait = min(max(self._redis_wait * 2, 0.5), 30.0)
        return self._redis_wait

    def _redis_back(self) -> None:
        if self._redis_wait:
            self.log.warning("Redis is back: resuming")
            self._redis_wait = 0.0

    def execute_job(self, job: Job, queue: Queue) -> None:
        """Run the job in this thread while a heartbeat thread renews its lease."""
        try:
            prune_dead_executions(self.connection, job)
            execution = self.prepare_execution(job)
            done = threading.Event()
            beat = threading.Thread(target=self._beat, args=(job, execution, done), daemon=True)
            beat.start()
            try:
                self.perform_job(job, queue, execution)
            finally:
                done.set()
                beat.join()
            self.set_state("idle")
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # The job's claim expires and the reaper hands it back once Redis answers.
            self._redis_down(exc)

    def _beat(self, job: Job, execution: Any, done: threading.Event) -> None:
        while not done.wait(HEARTBEAT_EVERY):
            try:
                self.maintain_heartbeats(job, execution)
            except (redis.ConnectionError, redis.TimeoutError):
                pass  # the main loop reports Redis outages

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        # A short lease renewed by ``_beat`` while the job runs: a killed worker's job is
        # noticed within job_lease + REAP_EVERY seconds, not RQ's minutes.
        return runtime.current().settings.job_lease

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        # RQ beats before and after every job (3 commands each); the worker's key lives
        # worker_ttl + 60 s, so a plain beat more often than every few seconds is waste.
        if timeout is None and pipeline is None and self.last_heartbeat is not None:
            if (now() - self.last_heartbeat).total_seconds() < WORKER_BEAT_EVERY:
                return
        try:
            super().heartbeat(timeout, pipeline)
        except (redis.ConnectionError, redis.TimeoutError):
            if pipeline is not None:
                raise

    def check_for_suspension(self, burst: bool) -> None:
        try:
            super().check_for_suspension(burst)
        except (redis.ConnectionError, redis.TimeoutError):
            pass  # reported by the dequeue loop

    def when_idle(self) -> None:
        """Housekeeping done only when there is no work (subclasses add theirs)."""

    def _periodic(self) -> None:
        """Due retries back to their frontiers (every 0.2 s); a reaper pass when it is our turn."""
        now = time.monotonic()
        if now - self._last_promote >= PROMOTE_EVERY:
            self._last_promote = now
            runtime.current().scheduler.promote_due()
        if now - self._last_reap >= REAP_EVERY:
            self._last_reap = now
            reap(self.connection)

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
    """Serves the download queues of ``sites``, always taking a site whose gate is open.

    One Lua call (``scheduler.NEXT_JOB``) picks the first due site whose gate is open
    and hands over one of its jobs; the job takes the gate right before its request.
    After the job, the site's RQ queue is topped up from its compact frontier if the
    call asked for it.
    """

    def __init__(self, connection: Redis, sites: Sequence[str], all_sites: bool = True, **kwargs: Any):
        queues = queues_for(connection, (keys.download_queue(s) for s in sites))
        super().__init__(queues, connection, sites, **kwargs)
        self._by_site = dict(zip(sites, queues, strict=True))
        self.site_scheduler = Scheduler(connection, () if all_sites else sites)
        self._refill: str | None = None
        self._warned: set[str] = set()
        self._last_repair = 0.0

    def next_job(self) -> tuple[tuple[Job, Queue] | None, float | None]:
        rt = runtime.current()
        for _ in range(MAX_REFILLS):
            step = self.site_scheduler.next()
            if step.site is not None and step.site not in self._by_site:
                self._give_back(step)
                continue
            if step.job_id is not None:
                assert step.site is not None
                queue = self._by_site[step.site]
                job = self._fetch(step.job_id, queue)
                if job is None:
                    continue
                self._refill = step.site if step.refill else None
                return (job, queue), None
            if step.site is not None:  # its RQ queue ran dry: turn compact entries into jobs
                rt.frontier(step.site).refill(JOBS_AHEAD)
                continue
            return None, step.wait
        return None, 0.0

    def when_idle(self) -> None:
        """Mark ready any served site that has work but is missing from the ready set.

        Jobs put straight into an RQ queue, or a ready set lost with a Redis restart,
        would otherwise never be seen. Costs a round trip per idle second, never while busy.
        """
        now = time.monotonic()
        if now - self._last_repair < REPAIR_EVERY:
            return
        self._last_repair = now
        with self.connection.pipeline(transaction=False) as pipe:
            for site, queue in self._by_site.items():
                pipe.llen(queue.key)
                pipe.zcard(keys.levels(site))
            replies = pipe.execute()
        stranded = {site: 0 for i, site in enumerate(self._by_site) if replies[2 * i] or replies[2 * i + 1]}
        if stranded:
            self.connection.zadd(keys.ready(), stranded, nx=True)  # type: ignore[arg-type]

    def _give_back(self, step: Next) -> None:
        """Return a job of a site this worker has no spider for to the front of its queue."""
        assert step.site is not None
        if step.site not in self._warned:
            self._warned.add(step.site)
            log.warning("no spider for site %r here: leaving its work to other workers", step.site)
        if step.job_id is not None:
            queue_key = keys.RQ_QUEUE_PREFIX + keys.download_queue(step.site)
            with self.connection.pipeline(transaction=True) as pipe:
                pipe.lrem(queue_key + ":intermediate", 1, step.job_id)
                pipe.lpush(queue_key, step.job_id)
                pipe.execute()

    def _fetch(self, job_id: str, queue: Queue) -> Job | None:
        try:
            job = Job.fetch(job_id, connection=self.connection, serializer=self.serializer)
        except NoSuchJobError:  # its hash expired or was deleted: drop the id
            self.connection.lrem(queue.intermediate_queue_key, 1, job_id)
            return None
        job.redis_server_version = self.get_redis_server_version()
        return job

    def execute_job(self, job: Job, queue: Queue) -> None:
        super().execute_job(job, queue)
        site, self._refill = self._refill, None
        if site is not None:
            try:
                runtime.current().frontier(site).refill(JOBS_AHEAD)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._redis_down(exc)  # the next NEXT_JOB asks for the refill again


class ParseWorker(CrawlWorker):
    """Serves the parse queue; in burst mode waits until downloads of ``sites`` drain too."""

    def __init__(self, connection: Redis, sites: Sequence[str], **kwargs: Any):
        super().__init__(queues_for(connection, [keys.PARSE_QUEUE]), connection, sites, **kwargs)
