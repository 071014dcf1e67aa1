"""A Redis outage as the download threads of one process live through it: together, not each alone."""

from __future__ import annotations

import logging
import threading
import time

#: Longest a thread waiting out an outage goes without looking at its stop event, seconds.
STOP_CHECK_EVERY = 0.5


class Outage:
    """A Redis outage as the threads of one process see it: said once (not once a thread), and over for
    all of them as soon as any one finds Redis back (``back``: a thread's look, the lease keeper's
    hand-back), so that after a failover no thread sleeps out the rest of its own backoff.

    Each thread keeps its own waits between its own tries (``backoff.outage_waits``); ``down`` notes a
    failure and returns the outage's number, ``wait`` sleeps one of those waits unless that outage ends
    or the thread is stopped first.
    """

    def __init__(self, log: logging.Logger):
        self._log = log
        self._cond = threading.Condition()
        self._down = False
        #: Outages over so far: an outage's number is this count while it lasts.
        self._ended = 0

    @property
    def is_down(self) -> bool:
        return self._down

    def down(self, exc: Exception) -> int:
        """A thread found Redis unreachable: the outage's number; its first failure logged in one line."""
        with self._cond:
            if not self._down:
                self._down = True
                self._log.error("Redis unreachable (%s): waiting and reconnecting", str(exc).splitlines()[0])
            return self._ended

    def back(self) -> None:
        """A thread found Redis answering: every thread waiting out the outage tries again now."""
        if not self._down:  # the common case, on every look: no lock taken
            return
        with self._cond:
            if self._down:
                self._down = False
                self._ended += 1
                self._log.warning("Redis is back: resuming")
                self._cond.notify_all()

    def wait(self, seconds: float, outage: int, stop_event: threading.Event) -> None:
        """Sleep ``seconds`` unless outage number ``outage`` ends or ``stop_event`` is set first."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while self._ended == outage and not stop_event.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(min(left, STOP_CHECK_EVERY))
