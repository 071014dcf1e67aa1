"""The lease keeper: one thread per process renewing the claims of the jobs its workers run."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from redis import Redis
from rq import Queue
from rq.executions import Execution
from rq.job import Job

from ..coord import inflight, joblife, reaper
from ..coord.joblife import renew_every

log = logging.getLogger("crawler.workers")

#: Seconds between two renewals of a process's note that it has jobs in hand (``inflight``).
BUSY_NOTE_EVERY = 1.0
#: A claim due within this share of ``joblife.renew_every`` is renewed with one due now (``LeaseKeeper``).
RENEW_TOGETHER = 0.25
#: Seconds between two tries at handing back the jobs a Redis outage cut short (``LeaseKeeper.cut``).
CUT_TRY_EVERY = 0.25


class LeaseKeeper:
    """One thread per process that renews the leases of the jobs its worker threads run.

    ``hold`` and ``release`` bracket a worker's job (one at a time per worker); its lease is
    renewed (``joblife.renew_claims``: RQ's heartbeats) every ``joblife.renew_every`` seconds from the
    job's start while it runs, and once ``release`` returns no renewal of that job is under
    way or to come. Claims due within ``RENEW_TOGETHER`` of a renewal's period of the first due
    are renewed with it, in one round trip. One thread for the process, not one per worker:
    hundreds of workers cost one waiting thread. While it holds any job, it notes the process busy for the
    fleet's drain looks (``inflight``), once a second, and takes the note back once it
    holds none. A job a Redis outage cut short (``cut``) it hands back itself as soon as Redis answers
    (``joblife.hand_back_cut``), trying every CUT_TRY_EVERY for as long as the job's lease may last, and
    says so (``on_back``): its tries are the process's first to see Redis back.
    """

    def __init__(self, name: str, connection: Redis, job_lease: float, on_back: Callable[[], None] = lambda: None):
        self._name = name
        #: Called once a hand-back went through: Redis answers again (``outage.Outage.back``).
        self._on_back = on_back
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
        #: Jobs cut short by a Redis outage, to hand back: queue, execution, ``unclaimed`` (the retries left of
        #: a job whose claim was cut: ``joblife.hand_back_cut``), when to give up (monotonic).
        self._cut: list[tuple[Queue, Execution, int | None, float]] = []
        self._cut_due = 0.0
        self._thread: threading.Thread | None = None

    def hold(self, worker: Any, job: Job, execution: Execution) -> None:
        with self._cond:
            self._start()
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

    def cut(self, worker: Any, queue: Queue) -> None:
        """``release`` of a job of ``queue`` that a Redis outage cut short: its worker gave it up, and this
        thread hands it back once Redis answers, not the reaper once its lease ran out (``job_lease``
        later: until then no worker would run it)."""
        with self._cond:
            held = self._held.get(worker)
            self.release(worker)
            if held is None:
                return
            self._add_cut(queue, held[1], None, time.monotonic() + self._job_lease)

    def cut_claim(self, queue: Queue, execution: Execution, retries_left: int, handed_out_at: float) -> None:
        """A job of ``queue`` whose claim (as ``execution``) a Redis outage cut: handed back once Redis answers,
        whether the claim was made or not, until STRANDED_AFTER - CUT_MARGIN after its hand-out
        (``handed_out_at``, monotonic), when the reaper may hand back a job left handed out itself."""
        give_up_at = handed_out_at + min(self._job_lease, reaper.STRANDED_AFTER) - joblife.CUT_MARGIN
        with self._cond:
            self._add_cut(queue, execution, retries_left, give_up_at)

    def _add_cut(self, queue: Queue, execution: Execution, unclaimed: int | None, give_up_at: float) -> None:
        self._start()
        self._cut.append((queue, execution, unclaimed, give_up_at))
        self._cut_due = 0.0
        self._cond.notify_all()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"lease-{self._name}", daemon=True)
            self._thread.start()

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
            self._cut.clear()  # the reaper's, once their leases run out
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        # Redis is called with the lock let go: a renewal or a note must not hold up the
        # holds and releases of every other thread.
        me = threading.current_thread()
        with self._cond:
            while self._thread is me:
                now = time.monotonic()
                if self._cut and now >= self._cut_due:
                    self._cut_due = now + CUT_TRY_EVERY
                    self._unlocked(self._hand_back)
                    continue
                if self._held and now >= self._note_due:
                    self._note_due = now + BUSY_NOTE_EVERY
                    self._unlocked(self._note, True)
                    continue
                if not self._held and self._noted:
                    self._note_due = 0.0
                    self._unlocked(self._note, False)
                    continue
                if not self._held:
                    self._cond.wait(self._cut_due - now if self._cut else None)
                    continue
                first_due = min(due for _, _, due in self._held.values())
                wake = min(first_due, self._note_due, self._cut_due if self._cut else first_due)
                if wake > now:
                    self._cond.wait(wake - now)
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

    def _hand_back(self) -> None:
        """Try to hand back each cut job (``joblife.hand_back_cut``); one kept while Redis is still out and
        its lease may last, dropped otherwise (handed back, finished meanwhile, or the reaper's)."""
        with self._cond:
            cut = list(self._cut)
        kept = []
        for queue, execution, unclaimed, give_up_at in cut:
            if time.monotonic() >= give_up_at:
                continue
            try:
                if joblife.hand_back_cut(self._connection, queue, execution, unclaimed):
                    log.info("job %s, cut short by a Redis outage, handed back", execution.job_id)
                self._on_back()  # the process's threads waiting out the outage try again now, not after their backoff
            except (redis.ConnectionError, redis.TimeoutError):
                kept.append((queue, execution, unclaimed, give_up_at))
            except Exception:  # refused by Redis (a key written by hand), or a bug: the reaper's to hand back
                log.exception("lease keeper: handing back job %s failed; left to the reaper", execution.job_id)
        with self._cond:
            self._cut = [entry for entry in self._cut if entry not in cut] + kept

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
