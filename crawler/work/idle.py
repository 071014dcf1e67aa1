"""What the download workers of one process share so that idle costs the same whatever their number.

A process of many worker threads with nothing to run now sends Redis one thread's looks,
not one look a thread: one thread (the *watcher*) looks for work and sleeps between looks
for as long as the scheduler says the first gate that matters stays closed; the others
sleep on a condition until a look finds work (then one more is woken, and so on while
there is work: ``IdleRoom``). Jobs that run on a clock (due retries, the reaper, the
outbox, the repair of the ready set) run once a period per process, not per thread
(``Every``). A burst that found the crawl drained ends every thread of the process.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

#: Seconds a sleeping worker waits before it checks its stop event and that someone watches.
SLEEPER_CHECK_EVERY = 1.0


class Every:
    """Per-name timers shared by threads: ``due(name, period)`` is True for one caller a period."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}

    def due(self, name: str, period: float) -> bool:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(name, float("-inf")) < period:
                return False
            self._last[name] = now
            return True


class IdleRoom:
    """Where a process's worker threads wait when a look for work found none to run now.

    ``rest`` makes the first thread in the *watcher*: it sleeps the time it was given
    (until the first gate opens, or a short idle period) and goes back to look. Any other
    thread sleeps until ``found_work`` or ``wake_all`` wakes it, or, every
    SLEEPER_CHECK_EVERY seconds, to check its stop event, take the watch if nobody holds
    it (a watcher that left on an error), and call ``on_check`` (its heartbeat). So the
    looks of an idle process are those of one thread.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._watching = False
        self._sleepers = 0
        self._members = 0
        #: Set when a burst found the crawl drained: every thread of the process ends. Cleared
        #: when the last of them leaves, so workers started later find work added since.
        self.drained = False

    def enter(self) -> None:
        """A worker starts its work loop."""
        with self._cond:
            self._members += 1

    def leave(self) -> None:
        """A worker ends its work loop; the last one out clears ``drained``."""
        with self._cond:
            self._members -= 1
            if self._members <= 0:
                self._members = 0
                self.drained = False

    def rest(self, wait: float, stop: threading.Event, on_check: Callable[[], Any] | None = None) -> None:
        """Return when it is this thread's turn to look for work again, or when it should stop."""
        while True:
            with self._cond:
                if self.drained or stop.is_set():
                    return
                if not self._watching:
                    self._watching = True
                    break
                self._sleepers += 1
                try:
                    woken = self._cond.wait(SLEEPER_CHECK_EVERY)
                finally:
                    self._sleepers -= 1
            if woken or stop.is_set() or self.drained:
                return
            if on_check is not None:
                on_check()  # outside the lock: it may call Redis
        try:
            stop.wait(wait)
        finally:
            with self._cond:
                self._watching = False

    def found_work(self) -> None:
        """A look found a job: wake one sleeper to look too (there may be more)."""
        with self._cond:
            if self._sleepers:
                self._cond.notify(1)

    def end_all(self) -> None:
        """The crawl is drained (a burst): every thread of the process ends its work."""
        with self._cond:
            self.drained = True
            self._cond.notify_all()


class Shared:
    """A process's shared idle state for one kind of worker: its room and its timers."""

    def __init__(self) -> None:
        self.room = IdleRoom()
        self.every = Every()


_shared: weakref.WeakKeyDictionary[Any, dict[tuple[type, tuple[str, ...]], Shared]] = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def shared(rt: Any, kind: type, sites: Sequence[str]) -> Shared:
    """The idle state shared by the workers of class ``kind`` serving ``sites`` against the runtime ``rt``.

    Only workers that would find the same work share a watcher: one of other sites would
    not look for theirs.
    """
    with _shared_lock:
        return _shared.setdefault(rt, {}).setdefault((kind, tuple(sorted(sites))), Shared())
