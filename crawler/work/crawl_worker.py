"""The crawler's RQ worker: RQ's work loop rebuilt from its public pieces, to run in any thread and stop on an event."""

from __future__ import annotations

import functools
import logging
import signal
import sys
import threading
import time
import traceback
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis import Redis
from rq import Queue, SimpleWorker
from rq.exceptions import StopRequested
from rq.executions import Execution
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.suspension import is_suspended
from rq.timeouts import JobTimeoutException
from rq.utils import now, utcformat
from rq.worker import WorkerStatus

from ..backoff import outage_waits
from ..coord import inflight, joblife, keys
from ..coord.joblife import WORKER_BEAT_EVERY, prune_dead_executions
from ..coord.reaper import REAP_EVERY, reap
from ..coord.vetting import CrawlerJob
from ..store import outbox
from . import drain, idle, listener, runtime
from .drain import crawl_drained
from .leases import LeaseKeeper
from .outage import Outage
from .watchdog import WatchdogDeathPenalty

#: Longest sleep between two looks of an idle process: new work is announced by Redis
#: (``listener``), so this only bounds how late a retry that came due is put back.
IDLE_SLEEP = 1.0
#: Least seconds between two drain looks of a burst process (``drain.crawl_drained``): a look
#: while anything runs or is queued costs a few commands, so a burst ends soon after its last page.
DRAIN_LOOK_EVERY = 0.05
#: Least seconds between two drain looks of a burst process whose last look found sites' work waiting
#: for their turn and no process with a job in hand (a crawl's tail of slow sites): the crawl cannot
#: end before a job is handed out, and the process that takes it looks again once it is done.
DRAIN_WAITING_EVERY = 0.25
#: Least seconds between two drain looks of a process that count every site's work (five commands
#: a site): made once nothing runs and the few commands found nothing (at the end, or while the
#: crawl's only retries wait behind other crawls' on the same Redis).
DRAIN_EVERY = 0.25
#: Seconds between two looks for retries that have come due.
PROMOTE_EVERY = 0.2
#: Seconds between two looks for ``rq suspend``.
SUSPENSION_CHECK_EVERY = 1.0
#: Seconds between two reaper passes of a process while no process of the fleet holds a job:
#: what could be stranded then is a job left between RQ's lists by a process that died.
IDLE_REAP_EVERY = 60.0
#: Queues a worker may serve and still be listed in each queue's worker set (``rq info``'s
#: per-queue view): each thread registers in each set as it starts and ends, so a worker of
#: more is listed in RQ's set of all workers only.
MOST_QUEUES_LISTED = 20
#: The address RQ read for each connection's first worker (``CrawlWorker._set_ip_address``).
_addresses: weakref.WeakKeyDictionary[Redis, str] = weakref.WeakKeyDictionary()
_addresses_lock = threading.Lock()
#: Seconds after a process starts before its first pass of RQ's registry maintenance (then one each
#: ``maintenance_interval``, 10 min). RQ runs it at once, some ten round trips a site as the crawl
#: starts, for nothing the reaper (``reaper.reap``) does not do from its first pass.
FIRST_MAINTENANCE_AFTER = 60.0
#: Seconds between two heartbeats of a worker asleep in its process's idle room: its key lives
#: ``worker_ttl`` + 60 s (RQ's default worker_ttl: 420 s).
SLEEPER_BEAT_EVERY = 60.0


class Suspension:
    """Whether RQ's workers are suspended (``rq suspend``), as one worker of the process last looked. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._looked_at = float("-inf")
        self._suspended = False

    def seen(self, connection: Redis) -> bool:
        """Suspended, as looked at in the last SUSPENSION_CHECK_EVERY seconds (looking now, for one caller, if not)."""
        now = time.monotonic()
        with self._lock:
            if now - self._looked_at < SUSPENSION_CHECK_EVERY:
                return self._suspended
            self._looked_at = now  # the others read the answer before this one: a second late at most
        suspended = bool(is_suspended(connection))
        with self._lock:
            self._suspended = suspended
        return suspended


class CrawlWorker(SimpleWorker):
    """Shared behaviour: JSON jobs, thread-safe timeouts, drain-aware burst, stop event.

    An ``rq.SimpleWorker``: jobs run in the worker's own process and thread, so the HTTP pool
    and database engine live across jobs, and RQ's registries, heartbeats and failure records
    are kept. RQ is used through its public interface only: its work loop is rebuilt here from
    RQ's public pieces (``bootstrap``, ``execute_job``, ``heartbeat``, ``teardown``), so
    that a worker may run in any thread and stops on its ``stop_event``; no private
    method is overridden and no private attribute read. Of a process's workers only one
    looks while there is nothing to run now; the others sleep until it finds work (``idle``).
    """

    death_penalty_class = WatchdogDeathPenalty  # SIGALRM works only in a process's main thread

    def __init__(
        self,
        queues: Sequence[Queue],
        connection: Redis,
        sites: Sequence[str],
        stop_event: threading.Event | None = None,
        *,
        rt: runtime.Runtime,
        **kwargs: Any,
    ):
        super().__init__(queues, connection=connection, serializer=JSONSerializer, job_class=CrawlerJob, **kwargs)
        #: What this worker's jobs run against (Redis, settings, spiders, HTTP pool, database); it gives
        #: it to each job it runs.
        self.runtime = rt
        #: Shared with the process's other workers of this class: one looks when there is no work.
        self._idle = idle.shared(self.runtime, type(self), sites)
        # One list of sites and of queues for every worker of the process, not copies a worker: RQ
        # copies its queues twice, and a slow site's paced batch holds a thread. RQ reads its
        # ordered copy only in the dequeue loop, rebuilt here.
        self.sites: list[str] = self._idle.made("sites", lambda: list(sites))
        if isinstance(queues, list):
            self.queues = self._ordered_queues = queues
        self.stop_event = stop_event or threading.Event()
        self._burst = False
        self._suspension: Suspension = self._idle.made("suspension", Suspension)
        self._stop_requests = 0
        #: This thread's waits between its tries while Redis does not answer (``_redis_down``), back to none
        #: when it does; the process's threads wait out an outage together (``outage``).
        self._redis_waits = outage_waits()
        self._outage: Outage = self._idle.made("outage", lambda: Outage(self.log))
        self._outage_seen = 0
        self._leases: LeaseKeeper = self._idle.made(
            "leases",
            lambda: LeaseKeeper(
                type(self).__name__, connection, self.runtime.settings.job_lease, on_back=self._outage.back
            ),
        )
        self._listener = listener.of(connection)
        #: Whether this worker may end once it slept unwanted for ``idle.RETIRE_AFTER`` seconds
        #: (the threads a process's pool added, not its first).
        self.may_retire = False
        #: Set by ``next_job`` with the job it found: seconds until another of the worker's sites is
        #: due, if the scheduler knows (``Next.quiet_for``); the thread woken to look next sleeps until then.
        self.quiet_for: float | None = None

    def work(self, burst: bool = False, logging_level: str | None = None, **kwargs: Any) -> bool:  # type: ignore[override]
        """Run jobs until stopped, or (``burst``) until the crawl is drained; whether any job ran.

        Drained: nothing queued, started or scheduled for the queues served and no page waiting
        in the pages stream, not one queue momentarily empty (``drain.crawl_drained``).

        RQ's loop, in this worker's terms: registered with RQ (``rq info`` lists it) and
        subscribed to RQ's command channel (``rq`` can stop it), suspension honoured,
        SIGTERM/SIGINT (main thread only) stop it after its job, a second one at once.
        """
        self._burst = burst
        level = logging_level or logging.getLevelName(logging.getLogger("rq").getEffectiveLevel())
        self._idle.room.enter()  # first: a room that grew this thread counts it from its start
        previous: dict[int, Any] = {}
        worked = 0
        try:
            self.bootstrap(level)
            previous = self._install_stop_handlers()
            while not self.stop_event.is_set():
                try:
                    if self.suspended(burst):
                        break
                    result = self.dequeue_job_and_maintain_ttl(None)
                    if result is None:
                        break
                    try:
                        self.execute_job(*result)
                    finally:
                        self._idle.room.done_work()
                    self.heartbeat()
                    worked += 1
                except StopRequested:
                    break
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    self._sit_out(self._redis_down(exc))
        finally:
            if self._idle.room.leave():
                self._leases.close()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.runtime.counters.flush()  # a burst's totals are exact once its workers are done
            try:
                self.teardown()
            except redis.RedisError:
                self.unsubscribe()  # its key expires on its own
        self.log.info("Worker %s: done (%d jobs)", self.name, worked)
        return bool(worked)

    def _set_ip_address(self, connection: Redis) -> None:
        """RQ's naming of the connection and reading of its address (two round trips), once a connection:
        the process's workers share its pool and its address, and a process grows hundreds of them."""
        with _addresses_lock:
            known = _addresses.get(connection)
            if known is None:
                super()._set_ip_address(connection)
                _addresses[connection] = self.ip_address
            else:
                self.ip_address = known

    def register_birth(self) -> None:
        """RQ's registration (``rq info`` lists the worker), in each queue's worker set only
        when it serves at most MOST_QUEUES_LISTED queues."""
        if len(self.queues) <= MOST_QUEUES_LISTED:
            super().register_birth()
            return
        self.birth_date = self.last_heartbeat = now()
        with self.connection.pipeline() as pipe:
            pipe.delete(self.key)
            pipe.hset(self.key, mapping=self.serialize())
            pipe.sadd(self.redis_workers_keys, self.key)
            pipe.expire(self.key, self.worker_ttl + 60)
            pipe.execute()

    def serialize(self) -> dict:  # as RQ declares it
        """RQ's worker hash, its ``queues`` field cut to MOST_QUEUES_LISTED names and a count of the
        others (``rq info`` shows it as written) for a worker of more, whose whole list would cost
        Redis memory for each worker thread."""
        data = super().serialize()
        names = self.queue_names()
        if len(names) > MOST_QUEUES_LISTED:
            data["queues"] = ",".join([*names[:MOST_QUEUES_LISTED], f"(and {len(names) - MOST_QUEUES_LISTED} more)"])
        return data

    def register_death(self) -> None:
        if len(self.queues) <= MOST_QUEUES_LISTED:
            super().register_death()
            return
        with self.connection.pipeline() as pipe:
            pipe.srem(self.redis_workers_keys, self.key)
            pipe.hset(self.key, "death", utcformat(now()))
            pipe.expire(self.key, 60)
            pipe.delete(self.executions_key)
            pipe.execute()

    def subscribe(self) -> None:
        """Hear RQ's commands to this worker through the process's one subscription (``listener``)."""
        self._listener.register(self, self._idle.room)

    def unsubscribe(self) -> None:
        self._listener.unregister(self)

    def _install_stop_handlers(self) -> dict[int, Any]:
        """SIGTERM and SIGINT call ``request_stop`` (main thread only); the handlers replaced."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {signum: signal.signal(signum, self.request_stop) for signum in (signal.SIGTERM, signal.SIGINT)}

    def request_stop(self, signum: Any, frame: Any) -> None:
        """Stop after the job in hand (a signal, or RQ's shutdown command); a second signal stops at once."""
        if self._stop_requests and signum is not None:
            self.log.warning("Worker %s: stopping now (a job cut short is handed back by the reaper)", self.name)
            raise SystemExit(1)
        self._stop_requests += 1
        self.log.warning("Worker %s: stopping after the current job", self.name)
        self.stop_event.set()

    def suspended(self, burst: bool) -> bool:
        """Wait while RQ's workers are suspended (``rq suspend``); True if the worker should end instead.

        Looked at once a second by one worker of the process, not by each (one EXISTS); the
        others read what it saw (``Suspension``). A burst worker ends when suspended, as RQ's do.
        """
        if not self._suspension.seen(self.connection):
            return False
        announced = False
        while self._suspension.seen(self.connection):
            if burst:
                self.log.info("Worker %s: suspended in burst mode, exiting", self.name)
                return True
            if not announced:
                self.log.info("Worker %s: suspended, run `rq resume` to resume", self.name)
                self.set_state(WorkerStatus.SUSPENDED)
                announced = True
            if self.stop_event.wait(1.0):
                return True
        if announced:
            self.set_state(WorkerStatus.IDLE)
        return False

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        room = self._idle.room
        while not self.stop_event.is_set():
            if self.suspended(self._burst):  # a thread woken by new work takes none while suspended
                return None
            handed = room.handed_watch()
            if handed > 0:  # the look that woke this thread knew nothing else is due before then
                if room.rest(handed, self.stop_event, self._sleeper_beat, self.may_retire):
                    self.log.debug("Worker %s: not needed for %.0f s, retiring", self.name, idle.RETIRE_AFTER)
                    return None
                continue
            may_look = room.start_look(self.stop_event, self._sleeper_beat, self.may_retire)
            if may_look is None:
                self.log.debug("Worker %s: not needed for %.0f s, retiring", self.name, idle.RETIRE_AFTER)
                return None
            if not may_look or room.drained:
                return None
            try:
                found, wait = self._dequeue_step()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                found, wait = None, -self._redis_down(exc)
            finally:
                room.end_look()
            if wait is not None and wait < 0:
                self._sit_out(-wait)
                continue
            self._redis_back()
            if found is not None:
                quiet_for, self.quiet_for = self.quiet_for, None
                room.found_work(None if quiet_for is None else min(quiet_for, IDLE_SLEEP))  # one more thread looks
                return found
            if self._handed_off():  # work for this thread outside the room: one more thread looks meanwhile
                room.found_work()
                return None
            if wait is None:  # drained
                return None
            if room.rest(wait, self.stop_event, self._sleeper_beat, self.may_retire):
                self.log.debug("Worker %s: not needed for %.0f s, retiring", self.name, idle.RETIRE_AFTER)
                return None
            if room.drained:
                return None
        return None

    @property
    def should_run_maintenance_tasks(self) -> bool:
        """RQ's registry cleaning, by one worker of the process a period, not by each of its threads,
        the first FIRST_MAINTENANCE_AFTER after the process started (RQ's own rule: at once, then each
        ``maintenance_interval`` by each worker)."""
        return self._idle.every.due("maintenance", self.maintenance_interval, first_after=FIRST_MAINTENANCE_AFTER)

    def _sleeper_beat(self) -> None:
        """Keep this worker's RQ key alive while it sleeps in the idle room (a beat a minute)."""
        if self.last_heartbeat is None or (now() - self.last_heartbeat).total_seconds() >= SLEEPER_BEAT_EVERY:
            self.heartbeat(self.worker_ttl + 60)

    def _dequeue_step(self) -> tuple[tuple[Job, Queue] | None, float | None]:
        """One look for work: a job, else seconds to wait (None: burst and drained).

        A worker that goes from one job to the next stays ``busy`` for RQ; it turns ``idle``
        when a look finds no job to run now (two writes a job fewer).
        """
        self.heartbeat()
        if self.should_run_maintenance_tasks:
            self.run_maintenance_tasks()
        self._periodic()
        found, wait = self.next_job()
        if found is not None:
            return found, None
        if self._handed_off():
            return None, 0.0
        if self.get_state() != WorkerStatus.IDLE:
            self.set_state(WorkerStatus.IDLE)
        # A burst looks for the drain after any look that found no job, not only one that found no
        # site: the ready set keeps each site that was served until its next turn shows it has no
        # work left, which would hold a drained burst one interval more.
        if self._drained():
            self._idle.room.end_all()  # the process's sleeping workers end too
            return None, None
        if wait is None:  # no work anywhere we serve
            self.when_idle()
            wait = self._drain_wait() if self._burst else IDLE_SLEEP  # a burst's drain look is what it waits for
        return None, min(wait, self._drain_wait() if self._burst else IDLE_SLEEP)

    def _drain_wait(self) -> float:
        """Longest a burst's look waits for the next: DRAIN_LOOK_EVERY once no thread of the process
        holds a job (the crawl may be over), DRAIN_EVERY while one does (it cannot be), and
        DRAIN_WAITING_EVERY while the last drain look found only sites' work waiting for its turn."""
        if self._leases.holding:
            return DRAIN_EVERY
        return DRAIN_WAITING_EVERY if self._idle.drain_saw == drain.SITES else DRAIN_LOOK_EVERY

    def _handed_off(self) -> bool:
        """Whether the look handed this thread a site to take a job of outside the lookers' room."""
        return False

    def _drained(self) -> bool:
        """A burst's drain look (``crawl_drained``), once a DRAIN_LOOK_EVERY per process while none of
        its threads holds a job, its count of every site's work once a DRAIN_EVERY; False when not a
        burst, or while a thread of the process holds a job (the crawl is not drained)."""
        if not self._burst:
            return False
        room, every, shared = self._idle.room, self._idle.every, self._idle
        if room.drained:
            return True
        period = DRAIN_WAITING_EVERY if shared.drain_saw == drain.SITES else DRAIN_LOOK_EVERY
        if self._leases.holding or not every.due("drain", period):  # a job in hand: not drained, nothing to ask
            return False
        seen: list[str] = []
        drained = crawl_drained(self.connection, self.sites, lambda: every.due("drain-all", DRAIN_EVERY), seen)
        shared.drain_saw = seen[0] if seen else ""
        return drained

    def _redis_down(self, exc: Exception) -> float:
        """Note the failure (the process's first of an outage is logged); this thread's wait before its next
        try (backoff to 30 s), cut short by ``_sit_out`` once any thread of the process finds Redis back."""
        self._outage_seen = self._outage.down(exc)
        return self._redis_waits.next()

    def _sit_out(self, seconds: float) -> None:
        self._outage.wait(seconds, self._outage_seen, self.stop_event)

    def _redis_back(self) -> None:
        self._outage.back()
        if self._redis_waits.failures:
            self._redis_waits.reset()

    def execute_job(self, job: Job, queue: Queue) -> None:
        """Claim the job, then run it in this thread while the lease keeper renews the claim."""
        begun = time.monotonic()  # NEXT_JOB handed it out just before
        cut = functools.partial(self._leases.cut_claim, queue, retries_left=job.retries_left or 0, handed_out_at=begun)
        try:
            try:
                prune_dead_executions(self.connection, job)
            except (redis.ConnectionError, redis.TimeoutError):
                cut(Execution(uuid.uuid4().hex, job.id, self.connection))  # no claim sent: back to its queue's front
                raise
            site = keys.site_of_queue(queue.name)
            # The site's live settings ride along when due for a re-read: the job reads them first thing.
            along = functools.partial(self._claim_reads, site=site) if site is not None else None
            execution = joblife.claim(self, job, queue, along, cut)
            self._leases.hold(self, job, execution)
            try:
                self.perform_job(job, queue, execution)
            except (redis.ConnectionError, redis.TimeoutError):
                self._leases.cut(self, queue)  # handed back as soon as Redis answers, not once its lease ran out
                raise
            finally:
                self._leases.release(self)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # A job cut before, during or after its claim is handed back by the lease keeper
            # (``LeaseKeeper.cut_claim``, ``cut``); one whose hand-out's reply was lost by the reaper
            # (``reaper.rescue_stranded``).
            self._redis_down(exc)

    def _claim_reads(self, pipe: Any, site: str) -> Callable[[list[Any]], None]:
        """What a job's claim reads along (``joblife.claim``): whether the site has a run of errors
        (``SiteMemory.claim_reads``), and its live settings when due (``SiteReads.read_site_along``)."""
        errors = self.runtime.memory.claim_reads(pipe, site)
        settings = self.runtime.sites.read_site_along(pipe, site)

        def keep(replies: list[Any]) -> None:
            errors(replies[:1])
            if settings is not None:
                settings(replies[1:])

        return keep

    def perform_job(self, job: Job, queue: Queue, execution: Execution) -> bool:
        """Run a job claimed by ``joblife.claim``; a success finished in one step, a failure through RQ.

        Crawler jobs return nothing and name no callback, webhook, dependency, group or
        repeat (``vetting`` refuses those), so a success only has to be counted and the job
        deleted (``joblife.finish``); a rate-limited job goes through RQ's ``handle_job_success``.
        A failure goes through RQ's ``handle_exception`` and ``handle_job_failure``
        (retries, the failed registry). What the job leaves to its end (``finishing``: its site's
        ``batch_over``) goes in the success's transaction, or after a failure, on its own. A failure
        a Redis outage caused is raised again once handled, for ``execute_job`` to hand the job back.
        """
        finishing: list[joblife.Finishing] = []
        try:
            job.started_at = now()
            timeout = job.timeout or self.queue_class.DEFAULT_TIMEOUT
            if isinstance(job, CrawlerJob):
                # The job runs against this worker's runtime, given, not looked up; a batch stops early on a stop.
                job.bound = {
                    "rt": self.runtime,
                    "stopping": self.stop_event.is_set,
                    "crowded": self._idle.room.crowded,
                    "finishing": finishing,
                    "rest": self.stop_event.wait,
                }
            with self.death_penalty_class(timeout, JobTimeoutException, job_id=job.id):
                job.perform()
        except:  # noqa: E722 -- as in RQ: whatever the job raised fails the job
            exc_info = sys.exc_info()
            job.ended_at = now()
            self.handle_exception(job, *exc_info)
            self.handle_job_failure(
                job,
                queue,
                started_job_registry=queue.started_job_registry,
                exc_string="".join(traceback.format_exception(*exc_info)),
                execution=execution,
            )
            joblife.run_finishing(self.connection, finishing)
            error = exc_info[1]
            if error is not None and _redis_outage(error):  # failure maybe unwritten: handed back once Redis is back
                raise error from None
            return False
        if job.has_rate_limit:
            job.ended_at = now()
            self.handle_job_success(job, queue, queue.started_job_registry, execution)
            joblife.run_finishing(self.connection, finishing)
        else:
            job.ended_at = now()
            joblife.finish(self, job, execution, finishing)
            self.log.info("Worker %s: %s: Job OK (%s)", self.name, job.origin, job.id)
        return True

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        # A short lease renewed by the lease keeper while the job runs: a killed worker's job is
        # noticed within job_lease + REAP_EVERY seconds, not RQ's minutes.
        return self.runtime.settings.job_lease

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

    def when_idle(self) -> None:
        """Housekeeping done only when there is no work (subclasses add theirs)."""

    def _periodic(self) -> None:
        """Due retries back to their frontiers (every 0.2 s); a reaper pass when it is our turn.

        Each once a period per process, whatever its number of workers (``idle.Every``). The
        reaper reads every served queue, so it runs every REAP_EVERY while some process of
        the fleet has jobs in hand (or died holding some: ``inflight``) or this one is a
        burst (which waits for what the reaper hands back), and every IDLE_REAP_EVERY
        otherwise, so an idle fleet costs Redis little whatever its number of sites.
        """
        every = self._idle.every
        if self.runtime.scheduler.may_have_due() and every.due("promote", PROMOTE_EVERY):
            self.runtime.scheduler.promote_due()
        if every.due("reap", REAP_EVERY) and (
            self._burst or inflight.busy_processes(self.connection) or every.due("idle-reap", IDLE_REAP_EVERY)
        ):
            reap(self.connection)
        if every.due("outbox", outbox.FLUSH_EVERY):
            outbox.flush(self.runtime.connection, self.runtime.store)

    def next_job(self) -> tuple[tuple[Job, Queue] | None, float | None]:
        """A job to run now, else how long until one may be ready (None: no work)."""
        for queue in self.queues:
            found = self._take(queue)
            if found is not None:
                return found, None
        return None, None

    def _take(self, queue: Queue) -> tuple[Job, Queue] | None:
        # A job this worker cannot trust or read is quarantined as it is read and skipped (``vetting``).
        result = Queue.dequeue_any(
            [queue], None, connection=self.connection, job_class=self.job_class, serializer=self.serializer
        )
        if result is not None:
            job, _ = result
            job.redis_server_version = self.get_redis_server_version()
            self.log.debug("Worker %s: %s: %s", self.name, queue.name, job.id)
        return result


def _redis_outage(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an exception it was raised from or while handling, is a Redis outage."""
    for _ in range(8):  # a chain of a few links, not a loop a cycle could hang
        if exc is None:
            return False
        if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
