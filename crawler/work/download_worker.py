"""Download workers: in-process RQ workers, gate-aware queue choice, drain; what every worker shares.

The download worker is an ``rq.SimpleWorker`` subclass (jobs run in the worker's own
process and thread, so the HTTP pool and database engine live across jobs) that keeps
RQ's registries, heartbeats and failure records. It asks the scheduler (two Lua calls, one
for a worker of one site, whatever the number of sites) for a site that has work *and*
whose gate is open, so it never sits behind one closed gate while another site has
budget; when every gate with work is closed it sleeps exactly until the first one opens.
Of a process's workers only one looks while there is nothing to run now; the others
sleep until it finds work (``idle``). Parse workers are not RQ
workers (``parsing``); they share the job-timeout watchdog and the drain test here.

``--burst`` means: exit when the whole crawl is drained (nothing queued, started or
scheduled for the download queues served, no page waiting in the pages stream), not
when one queue is momentarily empty.
"""

from __future__ import annotations

import functools
import itertools
import logging
import signal
import sys
import threading
import time
import traceback
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

from ..coord import inflight, joblife, keys
from ..coord.joblife import REAP_EVERY, WORKER_BEAT_EVERY, prune_dead_executions, reap, renew_every
from ..coord.replies import text
from ..coord.scheduler import FOLLOW_AHEAD, JOBS_AHEAD, Next, Scheduler, mark_ready
from ..coord.vetting import CrawlerJob
from ..store import outbox
from . import idle, listener, runtime
from .drain import crawl_drained, queues_for
from .watchdog import WatchdogDeathPenalty

log = logging.getLogger("crawler.workers")

#: Longest sleep between two looks of an idle process: new work is announced by Redis
#: (``listener``), so this only bounds how late a retry that came due is put back.
IDLE_SLEEP = 1.0
#: Least seconds between two drain looks of a burst process (``drain.crawl_drained``): a look
#: while anything runs or is queued costs a few commands, so a burst ends soon after its last page.
DRAIN_LOOK_EVERY = 0.05
#: Least seconds between two drain looks of a process that count every site's work (five commands
#: a site): made once nothing runs and the few commands found nothing (at the end, or while the
#: crawl's only retries wait behind other crawls' on the same Redis).
DRAIN_EVERY = 0.25
#: Seconds between two looks for retries that have come due.
PROMOTE_EVERY = 0.2
#: Seconds between two idle looks for sites with work missing from the ready set.
REPAIR_EVERY = 5.0
#: Sites one such look reads (two commands each), in turn: its cost is bounded whatever the sites' number.
REPAIR_SITES = 25
#: Seconds between two looks for sites with work that no worker of this process serves (to warn).
WARN_UNSERVED_EVERY = 30.0
#: Seconds between two looks for ``rq suspend``.
SUSPENSION_CHECK_EVERY = 1.0
#: Picks in one look (a site served elsewhere, a job gone) before the worker loops back to its checks.
MAX_TAKES = 8
#: Seconds between two reaper passes of a process while no process of the fleet holds a job:
#: what could be stranded then is a job left between RQ's lists by a process that died.
IDLE_REAP_EVERY = 60.0
#: Queues a worker may serve and still be listed in each queue's worker set (``rq info``'s
#: per-queue view): registering in 1,000 sets at each thread's start and end was 76 commands
#: a page at 1,000 sites. A worker of more is listed in RQ's set of all workers only.
MOST_QUEUES_LISTED = 20
#: Longest a thread that finished a paced batch waits for that site's gate to take its next
#: job itself (``DownloadWorker.follow``); a longer wait is left to the ready set and the lookers.
FOLLOW_WAIT = runtime.PACED_MAX_INTERVAL
#: Longest a thread that finished a paced batch waits for new work of its site when it has none
#: (``DownloadWorker.follow``): the links of its last pages, on their way through a parse worker.
WORK_WAIT = 2.0
#: Seconds between two renewals of a process's note that it has jobs in hand (``inflight``).
BUSY_NOTE_EVERY = 1.0
#: A claim due within this share of ``joblife.renew_every`` is renewed with one due now (``LeaseKeeper``).
RENEW_TOGETHER = 0.25
#: Seconds after a process starts before its first pass of RQ's registry maintenance (then one each
#: ``maintenance_interval``, 10 min). RQ runs it at once: each process of a fleet cleaning every
#: site's queue (some ten round trips each), 4,000 round trips at 200 sites while the crawl started,
#: for nothing our reaper (``joblife.reap``) does not do from its first pass: a job whose worker
#: died, or left in an intermediate list, is handed back by the reaper, not by RQ's maintenance.
FIRST_MAINTENANCE_AFTER = 60.0
#: Seconds between two heartbeats of a worker asleep in its process's idle room: its key lives
#: ``worker_ttl`` + 60 s (RQ's default worker_ttl: 420 s).
SLEEPER_BEAT_EVERY = 60.0


class LeaseKeeper:
    """One thread per process that renews the leases of the jobs its worker threads run.

    ``hold`` and ``release`` bracket a worker's job (one at a time per worker); its lease is
    renewed (``joblife.renew_claims``: RQ's heartbeats) every ``joblife.renew_every`` seconds from the
    job's start while it runs, and once ``release`` returns no renewal of that job is under
    way or to come. Claims due within ``RENEW_TOGETHER`` of a renewal's period of the first due
    are renewed with it, in one round trip. One thread for the process, not one per worker:
    hundreds of workers cost one waiting thread. While it holds any job, it notes the process busy for the
    fleet's drain looks (``inflight``), once a second, and takes the note back once it
    holds none.
    """

    def __init__(self, name: str, connection: Redis, job_lease: float):
        self._name = name
        self._connection = connection
        self._job_lease = job_lease
        self._renew_every = renew_every(job_lease)
        self._me = inflight.member()
        self._noted = False
        self._note_due = 0.0
        self._renewing: set[Any] = set()  # the workers whose claims are being renewed now
        self._cond = threading.Condition()
        #: Per worker: its job, the job's execution, when the next renewal is due.
        self._held: dict[Any, tuple[Job, Execution, float]] = {}
        self._thread: threading.Thread | None = None

    def hold(self, worker: Any, job: Job, execution: Execution) -> None:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"lease-{self._name}", daemon=True)
                self._thread.start()
            self._held[worker] = (job, execution, time.monotonic() + self._renew_every)
            if len(self._held) == 1:  # else the thread is waiting for an earlier renewal than this one
                self._cond.notify()

    def release(self, worker: Any) -> None:
        with self._cond:
            self._held.pop(worker, None)
            while worker in self._renewing:  # a renewal of its job under way: wait for it to end
                self._cond.wait()
            if not self._held:
                self._cond.notify_all()  # the process's busy note is taken back

    @property
    def holding(self) -> bool:
        """Whether a worker of the process holds a job now."""
        with self._cond:
            return bool(self._held)

    def close(self) -> None:
        """End the thread (a later ``hold`` starts another)."""
        with self._cond:
            thread, self._thread = self._thread, None
            self._held.clear()
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        # Redis is called with the lock let go: a renewal or a note must not hold up the
        # holds and releases of every other thread (40 of 85 threads queued on it at 200 sites).
        me = threading.current_thread()
        with self._cond:
            while self._thread is me:
                now = time.monotonic()
                if self._held and now >= self._note_due:
                    self._note_due = now + BUSY_NOTE_EVERY
                    self._unlocked(self._note, True)
                    continue
                if not self._held and self._noted:
                    self._note_due = 0.0
                    self._unlocked(self._note, False)
                    continue
                if not self._held:
                    self._cond.wait()
                    continue
                first_due = min(due for _, _, due in self._held.values())
                if min(first_due, self._note_due) > now:
                    self._cond.wait(min(first_due, self._note_due) - now)
                    continue
                if first_due > now:
                    continue
                # Every claim due soon is renewed with the first: one round trip for them all.
                soon = now + self._renew_every * RENEW_TOGETHER
                claims = [
                    (worker, job, execution) for worker, (job, execution, due) in self._held.items() if due <= soon
                ]
                self._renewing = {worker for worker, _, _ in claims}
                try:
                    self._unlocked(self._renew, claims)
                finally:
                    self._renewing = set()
                    self._cond.notify_all()
                for worker, job, execution in claims:
                    if self._held.get(worker, (None,))[0] is job:
                        self._held[worker] = (job, execution, time.monotonic() + self._renew_every)
            if self._noted:
                self._unlocked(self._note, False)

    def _unlocked(self, call: Callable[..., None], *args: Any) -> None:
        """``call(*args)`` with the lock let go meanwhile (the caller holds it)."""
        self._cond.release()
        try:
            call(*args)
        finally:
            self._cond.acquire()

    def _renew(self, claims: list[tuple[Any, Job, Execution]]) -> None:
        try:
            joblife.renew_claims(self._connection, claims)
        except (redis.ConnectionError, redis.TimeoutError):
            pass  # the main loop reports Redis outages
        except Exception:  # refused by Redis (a key written by hand), or a bug: said, and the thread lives on
            # Ended, the thread would renew no claim of the process again: every job it runs
            # would be handed back by the reaper and run twice.
            log.exception("lease keeper: renewing %d claims failed; trying again next period", len(claims))

    def _note(self, busy: bool) -> None:
        try:
            if busy:
                inflight.note_busy(self._connection, self._me, self._job_lease)
            else:
                inflight.note_idle(self._connection, self._me)
            self._noted = busy
        except redis.RedisError:
            pass  # the note lapses on its own; the main loop reports Redis outages
        except Exception:  # a bug: said, and the thread lives on (it renews the claims too)
            log.exception("lease keeper: noting the process %s failed", "busy" if busy else "idle")


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

    RQ is used through its public interface only: its work loop is rebuilt here from
    RQ's public pieces (``bootstrap``, ``execute_job``, ``heartbeat``, ``teardown``), so
    that a worker may run in any thread and stops on its ``stop_event``; no private
    method is overridden and no private attribute read.
    """

    death_penalty_class = WatchdogDeathPenalty  # SIGALRM works only in a process's main thread

    def __init__(
        self,
        queues: Sequence[Queue],
        connection: Redis,
        sites: Sequence[str],
        stop_event: threading.Event | None = None,
        rt: runtime.Runtime | None = None,
        **kwargs: Any,
    ):
        super().__init__(queues, connection=connection, serializer=JSONSerializer, job_class=CrawlerJob, **kwargs)
        #: What this worker's jobs run against (Redis, settings, spiders, HTTP pool, database); it gives
        #: it to each job it runs. Without one, the runtime installed in this process.
        self.runtime = rt if rt is not None else runtime.current()
        #: Shared with the process's other workers of this class: one looks when there is no work.
        self._idle = idle.shared(self.runtime, type(self), sites)
        # One list of sites and of queues for every worker of the process, not copies a worker: RQ
        # copies its queues twice, and a slow site's paced batch holds a thread (24 KB a thread at
        # 1,000 sites). RQ reads its ordered copy only in the dequeue loop, rebuilt here.
        self.sites: list[str] = self._idle.made("sites", lambda: list(sites))
        if isinstance(queues, list):
            self.queues = self._ordered_queues = queues
        self.stop_event = stop_event or threading.Event()
        self._burst = False
        self._suspension: Suspension = self._idle.made("suspension", Suspension)
        self._stop_requests = 0
        self._redis_wait = 0.0
        self._leases: LeaseKeeper = self._idle.made(
            "leases", lambda: LeaseKeeper(type(self).__name__, connection, self.runtime.settings.job_lease)
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
                    self.stop_event.wait(self._redis_down(exc))
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
        others (``rq info`` shows it as written) for a worker of more: the whole list was 20 KB of Redis
        memory a worker thread at 1,000 sites."""
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

        Looked at once a second by one worker of the process, not by each: one EXISTS (256
        threads a process each asking once a second were 2 % of its CPU at 1,000 sites); the
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
                self.stop_event.wait(-wait)
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
        # work left, so at the end of a crawl it waited one interval more (5 s of 78 at 1,000 sites).
        if self._drained():
            self._idle.room.end_all()  # the process's sleeping workers end too
            return None, None
        if wait is None:  # no work anywhere we serve
            self.when_idle()
            wait = self._drain_wait() if self._burst else IDLE_SLEEP  # a burst's drain look is what it waits for
        return None, min(wait, self._drain_wait() if self._burst else IDLE_SLEEP)

    def _drain_wait(self) -> float:
        """Longest a burst's look waits for the next: DRAIN_LOOK_EVERY once no thread of the process
        holds a job (the crawl may be over), DRAIN_EVERY while one does (it cannot be)."""
        return DRAIN_EVERY if self._leases.holding else DRAIN_LOOK_EVERY

    def _handed_off(self) -> bool:
        """Whether the look handed this thread a site to take a job of outside the lookers' room."""
        return False

    def _drained(self) -> bool:
        """A burst's drain look (``crawl_drained``), once a DRAIN_LOOK_EVERY per process while none of
        its threads holds a job, its count of every site's work once a DRAIN_EVERY; False when not a
        burst, or while a thread of the process holds a job (the crawl is not drained)."""
        if not self._burst:
            return False
        room, every = self._idle.room, self._idle.every
        return room.drained or (
            not self._leases.holding  # a job of this process in hand: not drained, nothing to ask
            and every.due("drain", DRAIN_LOOK_EVERY)
            and crawl_drained(self.connection, self.sites, lambda: every.due("drain-all", DRAIN_EVERY))
        )

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
        """Claim the job, then run it in this thread while the lease keeper renews the claim."""
        try:
            prune_dead_executions(self.connection, job)
            site = keys.site_of_queue(queue.name)
            # The site's live settings ride along when due for a re-read: the job reads them first thing.
            along = functools.partial(self.runtime.read_site_along, site=site) if site is not None else None
            execution = joblife.claim(self, job, queue, along)
            self._leases.hold(self, job, execution)
            try:
                self.perform_job(job, queue, execution)
            finally:
                self._leases.release(self)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # The job's claim expires and the reaper hands it back once Redis answers.
            self._redis_down(exc)

    def perform_job(self, job: Job, queue: Queue, execution: Execution) -> bool:
        """Run a job claimed by ``joblife.claim``; a success finished in one step, a failure through RQ.

        Crawler jobs return nothing and name no callback, webhook, dependency, group or
        repeat (``vetting`` refuses those), so a success only has to be counted and the job
        deleted (``joblife.finish``); a rate-limited job goes through RQ's ``handle_job_success``.
        A failure goes through RQ's ``handle_exception`` and ``handle_job_failure``
        (retries, the failed registry). What the job leaves to its end (``finishing``: its site's
        ``batch_over``) goes in the success's transaction, or after a failure, on its own.
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
        otherwise: an idle fleet of 1,000 sites sent Redis 1,000 commands a second a process
        for it.
        """
        every = self._idle.every
        if every.due("promote", PROMOTE_EVERY):
            self.runtime.scheduler.promote_due()
        if every.due("reap", REAP_EVERY) and (
            self._burst or inflight.busy_processes(self.connection) or every.due("idle-reap", IDLE_REAP_EVERY)
        ):
            reap(self.connection)
        if every.due("outbox", outbox.FLUSH_EVERY):
            outbox.flush(self.runtime)

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


class DownloadWorker(CrawlWorker):
    """Serves the download queues of ``sites``, always taking a site whose gate is open.

    ``PICK_SITE`` names the first due site and ``NEXT_JOB`` hands over one of its jobs if
    its gate opens soon (``scheduler.Scheduler.next``; a worker of one site skips the
    pick); the job takes the gate right before its request. After the job, the site's RQ
    queue is topped up from its compact frontier if the call asked for it.
    """

    def __init__(self, connection: Redis, sites: Sequence[str], rt: runtime.Runtime | None = None, **kwargs: Any):
        rt = rt if rt is not None else runtime.current()
        # Made once per process, not per thread: a queue object a site, and the scheduler's
        # keys a site, would cost each of hundreds of threads a copy for each of 1,000 sites.
        shared = idle.shared(rt, type(self), sites)
        queues = shared.made("queues", lambda: queues_for(connection, (keys.download_queue(s) for s in sites)))
        super().__init__(queues, connection, sites, rt=rt, **kwargs)
        self._by_site: dict[str, Queue] = shared.made("by_site", lambda: dict(zip(sites, queues, strict=True)))
        # Always the sites this worker has spiders for: a site seeded elsewhere, or whose
        # spider failed to load here, is never handed to it (it would hand it back, again
        # and again, at tens of thousands of Redis calls a second).
        self.site_scheduler: Scheduler = shared.made("scheduler", lambda: Scheduler(connection, sites))
        self._refill: str | None = None
        self._warned: set[str] = set()
        self._site_of: dict[str, str] = shared.made("site_of", lambda: {q.name: s for s, q in self._by_site.items()})
        #: The site this thread takes its next job of outside the lookers' room (``follow``), when its
        #: gate opens (monotonic), and whether a look handed it over (its queue dry; the thread counted busy).
        self._follow: tuple[str, float, bool] | None = None

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        while True:
            found = self.follow() or super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            if found is not None or self._follow is None:
                return found
            if self.stop_event.is_set():  # the look's hand-off is left: its thread is free again
                self._follow = None
                self._idle.room.done_work()
                return None
            # The look handed this thread a site whose queue ran dry: it refills it in ``follow``.

    def _handed_off(self) -> bool:
        return self._follow is not None

    def follow(self) -> tuple[Job, Queue] | None:
        """The next job of the site whose paced batch this thread just ran, taken ahead of its gate, if any.

        When a paced batch ends, its site is due again as its gate opens (``BATCH_OVER``); left
        to the ready set, its next job waits for a looker, whose sleep was set before the site
        came due, up to a second later. The thread that ran it knows when the gate opens (its own
        send rearmed it): it sleeps until FOLLOW_AHEAD before (FOLLOW_WAIT at most) and asks for
        that site's next job alone (NEXT_JOB), outside the lookers' room; the job's gate wait does
        the rest. When the site has no work yet (its last pages' links are still with a parse
        worker), the thread waits WORK_WAIT for work of it to be announced (``IdleRoom.expect``)
        and asks again: a site crawled by following its links got each turn up to a second late.
        None: no job (taken by another worker, no work came), and the thread looks as usual. A look
        that met a site whose RQ queue ran dry hands it here too (``next_job``): refilled, then taken.
        """
        follow, self._follow = self._follow, None
        if follow is None:
            return None
        site, opens_at, handed = follow
        room = self._idle.room
        wait = opens_at - FOLLOW_AHEAD - time.monotonic()
        if wait > FOLLOW_WAIT:
            return None
        if not handed:  # a look's hand-off was counted busy by the look (``found_work``)
            room.hold_thread()
        found: tuple[Job, Queue] | None = None
        # A dry queue handed by a look has work: no need to wait for any (nor to take another
        # thread's expectation of the site's work).
        announced = None if handed else room.expect(site)
        try:
            if wait > 0 and room.pause(wait, self.stop_event):  # a burst that drained meanwhile ends at once
                return None
            awaited = announced is None
            for _ in range(MAX_TAKES):
                step = self._take_followed(site, handed)
                handed = False
                if step is None or isinstance(step, tuple):
                    found = step
                    return found
                if step.wait is not None and step.wait <= FOLLOW_WAIT:  # due later: its gate, a refill
                    if room.pause(step.wait, self.stop_event):
                        return None
                elif step.wait is None and not awaited:  # no work now: its links may be on their way
                    awaited = True
                    assert announced is not None
                    if not room.await_work(announced, WORK_WAIT, self.stop_event):
                        return None
                else:
                    return None
            return None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._redis_down(exc)
            return None
        finally:
            if announced is not None:
                room.unexpect(site, announced)
            if found is None:
                room.done_work()

    def _take_followed(self, site: str, handed: bool) -> tuple[Job, Queue] | Next | None:
        """``follow``'s ask for ``site``'s next job, FOLLOW_AHEAD before its gate opens: the job, or the
        scheduler's answer without one (when to ask again, or no work), or None (the job was gone).
        ``handed``: a look found the site's queue dry (NEXT_JOB said so and holds the site for the refill)."""
        step = Next(site=site, refill=True) if handed else self.site_scheduler.next_of(site, FOLLOW_AHEAD)
        if step.site is not None and step.job_id is None:  # its RQ queue ran dry: refill, then take
            self.runtime.frontier(site).refill(JOBS_AHEAD, due_now=True)
            step = self.site_scheduler.next_of(site, FOLLOW_AHEAD)
        if step.site is None or step.job_id is None:
            return step if step.site is None else None
        queue = self._by_site[site]
        job = joblife.fetch(self.connection, step.job_id, queue)
        if job is None:
            return None
        self._refill = site if step.refill else None
        return job, queue

    def next_job(self) -> tuple[tuple[Job, Queue] | None, float | None]:
        scheduler = self.site_scheduler
        for _ in range(MAX_TAKES):
            # Every answer is used in the look that asked for it: a job handed out and then
            # left behind would sit in RQ's intermediate list until the reaper's next pass.
            step = scheduler.next()
            if step.site is not None and step.site not in self._by_site:
                self._give_back(step)
                continue
            if step.job_id is not None:
                assert step.site is not None
                queue = self._by_site[step.site]
                job = joblife.fetch(self.connection, step.job_id, queue)
                if job is None:
                    continue
                self._refill = step.site if step.refill else None
                self.quiet_for = step.quiet_for
                return (job, queue), None
            if step.site is None:
                return None, step.wait
            # Its RQ queue ran dry: this thread compacts entries into jobs and takes the site's turn
            # outside the lookers' room (``follow``). Done in the look, each refill held one of the
            # process's MOST_LOOKING looks for its ten round trips: at 1,000 sites on a loaded
            # machine 0.8 s each, and new sites started at a few a second.
            self._follow = (step.site, 0.0, True)
            return None, 0.0
        return None, 0.0

    def when_idle(self) -> None:
        """Mark ready any served site that has work but is missing from the ready set.

        Jobs put straight into an RQ queue, or a ready set lost with a Redis restart,
        would otherwise never be seen. Costs a round trip per idle second, never while busy:
        REPAIR_SITES sites a look, in turn, so every site is read once in sites /
        REPAIR_SITES seconds of idle time (the first look after a start reads them all).
        The process's counts are written too once it has stopped counting, so a crawl at
        rest shows exact totals (``counters.Counters.flush_if_quiet``).
        """
        self.runtime.counters.flush_if_quiet()
        if not self._idle.every.due("repair", REPAIR_EVERY):  # once a period per process
            return
        turn = next(self._idle.made("repair", itertools.count))
        sites = list(self._by_site)
        looked = sites
        if turn and len(sites) > REPAIR_SITES:
            start = (turn - 1) * REPAIR_SITES % len(sites)
            looked = (sites + sites)[start : start + REPAIR_SITES]
        with self.connection.pipeline(transaction=False) as pipe:
            for site in looked:
                pipe.llen(self._by_site[site].key)
                pipe.zcard(keys.levels(site))
            replies = pipe.execute()
        mark_ready(self.connection, {s: 0 for i, s in enumerate(looked) if replies[2 * i] or replies[2 * i + 1]})
        if self._idle.every.due("unserved", WARN_UNSERVED_EVERY):
            self._warn_unserved()

    def _warn_unserved(self) -> None:
        """Say once per site that a site with work waiting has no spider in this worker."""
        others = sorted({text(s) for s in self.connection.smembers(keys.sites())} - set(self._by_site) - self._warned)
        if not others:
            return
        with self.connection.pipeline(transaction=False) as pipe:
            for site in others:
                pipe.zscore(keys.ready(), site)
            waiting = pipe.execute()
        for site, score in zip(others, waiting, strict=True):
            if score is not None:
                self._warned.add(site)
                log.warning(
                    "site %r has work but no spider in this worker (not loaded here, or its module "
                    "failed to load): left to other workers",
                    site,
                )

    def _give_back(self, step: Next) -> None:
        """Return a job of a site this worker has no spider for to the front of its queue."""
        assert step.site is not None
        if step.site not in self._warned:
            self._warned.add(step.site)
            log.warning("no spider for site %r here: leaving its work to other workers", step.site)
        if step.job_id is not None:
            joblife.give_back(self.connection, step.site, step.job_id)

    def execute_job(self, job: Job, queue: Queue) -> None:
        super().execute_job(job, queue)
        served = self._site_of.get(queue.name)
        # Not when every thread is busy: the thread's turn goes to whichever site waits longest.
        if served is not None and self.runtime.batching(served).paced and not self._idle.room.crowded():
            self._follow = (served, self.runtime.gate_opens_at(served), False)
        site, self._refill = self._refill, None
        if site is not None:
            try:
                self.runtime.frontier(site).refill(JOBS_AHEAD)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._redis_down(exc)  # the site's next NEXT_JOB asks for the refill again
