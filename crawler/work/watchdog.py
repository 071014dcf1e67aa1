"""Job timeouts for worker threads: one watchdog thread per process raises them in the thread that overran.

RQ's own timeouts use SIGALRM, which works only in a process's main thread; download
and parse workers run in any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from rq.timeouts import TimerDeathPenalty

log = logging.getLogger("crawler.workers")


class _Watchdog:
    """One thread per process that raises jobs' timeouts in their worker threads.

    Deadlines are armed and disarmed under one lock, and fired under it, so a timeout
    never fires after its job's ``with`` block has disarmed it.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: dict[int, tuple[float, Callable[[], Any]]] = {}
        self._tokens = 0
        self._thread: threading.Thread | None = None
        #: When the watchdog thread wakes up next on its own (inf: it waits for an arm).
        self._wakes_at = float("inf")

    def arm(self, seconds: float, fire: Callable[[], Any]) -> int:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="job-timeouts", daemon=True)
                self._thread.start()
            self._tokens += 1
            due = time.monotonic() + seconds
            self._armed[self._tokens] = (due, fire)
            # Woken only for a deadline earlier than the one it waits for: a job's deadline is
            # nearly always later, and a wake-up per job cost a thread switch per job.
            if due < self._wakes_at:
                self._cond.notify()
            return self._tokens

    def disarm(self, token: int) -> None:
        with self._cond:
            self._armed.pop(token, None)

    def _run(self) -> None:
        with self._cond:
            while True:
                if not self._armed:
                    self._wakes_at = float("inf")
                    self._cond.wait()
                    continue
                token, (due, fire) = min(self._armed.items(), key=lambda kv: kv[1][0])
                left = due - time.monotonic()
                if left > 0:  # a deadline disarmed meanwhile only costs a wake-up to look again
                    self._wakes_at = due
                    self._cond.wait(left)
                    continue
                del self._armed[token]
                try:
                    fire()
                except (ValueError, SystemError):  # the thread is gone: nothing left to stop
                    log.warning("job timeout could not be raised in its thread", exc_info=True)


_WATCHDOG = _Watchdog()


class WatchdogDeathPenalty(TimerDeathPenalty):
    """RQ's thread-safe job timeout, with one watchdog thread per process, not a timer thread per job.

    Same effect as ``TimerDeathPenalty`` (the job's thread gets ``JobTimeoutException``
    when the job overruns), without starting and cancelling a thread for every job.
    """

    _token: int | None = None

    def setup_death_penalty(self) -> None:
        if self._timeout > 0:
            self._token = _WATCHDOG.arm(self._timeout, self.handle_death_penalty)

    def cancel_death_penalty(self) -> None:
        if self._token is not None:
            _WATCHDOG.disarm(self._token)
            self._token = None
