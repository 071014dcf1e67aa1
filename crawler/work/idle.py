"""What the download workers of one process share so that idle costs the same whatever their number.

A process of many worker threads with nothing to run now sends Redis one thread's looks,
not one look a thread: one thread (the *watcher*) looks for work and sleeps between looks
for as long as the scheduler says the first gate that matters stays closed, or until
Redis says work came (``poke``, from the process's ``listener``); the others sleep on a
condition until a look finds work (then one more is woken, and so on while there is
work: ``IdleRoom``). When a look finds work and no thread is left to look for more, the
room asks for one more thread (``grow``, the process's elastic pool), so the threads in
flight follow the work; a thread that slept unwanted for ``RETIRE_AFTER`` seconds
retires. Jobs that run on a clock (due retries, the reaper, the outbox, the repair of
the ready set) run once a period per process, not per thread (``Every``). A burst that
found the crawl drained ends every thread of the process.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("crawler.workers")

#: Seconds a sleeping worker waits before it checks its stop event and that someone watches.
SLEEPER_CHECK_EVERY = 1.0
#: Seconds a grown thread sleeps unwanted before it retires (threads beyond the first only).
RETIRE_AFTER = 60.0
#: Threads of a process that look for work at once. A thread done with its job that finds this
#: many looking sleeps until a look finds work (more looking at once would each be handed the
#: same first due site, for nothing).
MOST_LOOKING = 2


class Every:
    """Per-name timers shared by threads: ``due(name, period)`` is True for one caller a period."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}

    def due(self, name: str, period: float, first_after: float = 0.0) -> bool:
        """Whether ``name`` is due (then not again for ``period`` seconds); the first time it is asked,
        only if ``first_after`` is 0, else it is first due ``first_after`` seconds later."""
        now = time.monotonic()
        with self._lock:
            if name not in self._last and first_after > 0:
                self._last[name] = now - period + first_after
            if now - self._last.get(name, float("-inf")) < period:
                return False
            self._last[name] = now
            return True


class IdleRoom:
    """Where a process's worker threads wait when a look for work found none to run now.

    ``rest`` makes the first thread in the *watcher*: it sleeps the time it was given
    (until the first gate opens, or a short idle period), or until ``poke``, and goes back
    to look. Any other thread sleeps until ``found_work`` or ``end_all`` wakes it, or,
    every SLEEPER_CHECK_EVERY seconds, to check its stop event, take the watch if nobody
    holds it (a watcher that left on an error), and call ``on_check`` (its heartbeat). So
    the looks of an idle process are those of one thread.

    A look that finds a job (``found_work``) makes its thread busy until ``done_work``.
    With no thread left free to look for the next job (none asleep, watching, or
    between two jobs), the room calls ``grow`` (set by the process's pool) for one more,
    up to ``most`` threads: so a process keeps as many requests in flight as its sites'
    gates and latencies allow, with no thread count to compute.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._watching = False
        self._poked = threading.Event()
        self._sleepers = 0
        self._looking = 0
        self._members = 0
        self._starting = 0
        self._busy = 0
        self._handed_until = 0.0  # monotonic: the watch ``found_work`` handed over (``handed_watch``)
        self._ending = threading.Condition(threading.Lock())  # what ``pause`` waits on: ``end_all`` wakes it
        #: Sites a thread waits for work of (``expect``), each with what tells it.
        self._expected: dict[str, threading.Event] = {}
        #: Set when a burst found the crawl drained: every thread of the process ends. Cleared
        #: when the last of them leaves, so workers started later find work added since.
        self.drained = False
        #: Starts one more worker thread of this room (it calls ``enter``), or says False; None: the room does not grow.
        self.grow: Callable[[], bool] | None = None
        #: Most threads ``grow`` brings the room to.
        self.most = 1

    @property
    def members(self) -> int:
        """Worker threads in their work loop, and those ``grow`` is starting."""
        with self._cond:
            return self._members + self._starting

    def enter(self) -> None:
        """A worker starts its work loop."""
        with self._cond:
            self._members += 1
            self._starting = max(0, self._starting - 1)

    def not_started(self) -> None:
        """A thread ``grow`` started could not make its worker: it will never ``enter``."""
        with self._cond:
            self._starting = max(0, self._starting - 1)

    def leave(self) -> bool:
        """A worker ends its work loop; the last one out clears ``drained``. True for the last one out."""
        with self._cond:
            self._members -= 1
            if self._members <= 0 and not self._starting:
                self._members = 0
                self.drained = False
                return True
            return False

    def start_look(
        self, stop: threading.Event, on_check: Callable[[], Any] | None = None, may_retire: bool = False
    ) -> bool | None:
        """Wait until this thread may look for work (fewer than MOST_LOOKING look); True then
        (``end_look`` when done), False when it should stop, None when it should retire."""
        unwanted = 0.0
        while True:
            with self._cond:
                if self.drained or stop.is_set():
                    return False
                if self._looking < MOST_LOOKING:
                    self._looking += 1
                    return True
                woken = self._sleep()
            if not woken:
                unwanted += SLEEPER_CHECK_EVERY
                if may_retire and unwanted >= RETIRE_AFTER:
                    return None
                if on_check is not None:
                    on_check()  # outside the lock: it may call Redis

    def end_look(self) -> None:
        """A look that ``start_look`` let start is over."""
        with self._cond:
            self._looking = max(0, self._looking - 1)

    def _sleep(self) -> bool:
        """Sleep (holding ``_cond``) until woken or SLEEPER_CHECK_EVERY seconds; whether woken."""
        self._sleepers += 1
        try:
            return self._cond.wait(SLEEPER_CHECK_EVERY)
        finally:
            self._sleepers -= 1

    def rest(
        self, wait: float, stop: threading.Event, on_check: Callable[[], Any] | None = None, may_retire: bool = False
    ) -> bool:
        """Return when it is this thread's turn to look for work again, or when it should stop.

        True when the thread should retire: ``may_retire`` and asleep, unwanted, for RETIRE_AFTER seconds.
        """
        unwanted = 0.0
        while True:
            with self._cond:
                if self.drained or stop.is_set():
                    return False
                if not self._watching:
                    self._watching = True
                    self._poked.clear()
                    break
                woken = self._sleep()
            if woken or stop.is_set() or self.drained:
                return False
            unwanted += SLEEPER_CHECK_EVERY
            if may_retire and unwanted >= RETIRE_AFTER:
                return True
            if on_check is not None:
                on_check()  # outside the lock: it may call Redis
        try:
            deadline = time.monotonic() + wait
            while not stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0 or self._poked.wait(min(left, SLEEPER_CHECK_EVERY)):
                    break
        finally:
            with self._cond:
                self._watching = False
        return False

    def poke(self, site: str | None = None) -> None:
        """Work came (Redis said so; of ``site`` when known): the watcher looks now rather than at the end of
        its sleep, and a thread that ``expect``s work of that site is told."""
        self._poked.set()
        if site is not None:
            self.tell(site)

    def tell(self, site: str) -> None:
        """Work of ``site`` came (Redis said so): the thread that ``expect``s it is told, no one else."""
        expected = self._expected.get(site)  # a dict's get is atomic: no lock for every announcement
        if expected is not None:
            expected.set()

    def expect(self, site: str) -> threading.Event:
        """From now on, set the event returned when work of ``site`` is announced (``poke``) or the burst
        drains (``end_all``), until ``unexpect``: a thread that follows its site waits on it (``await_work``).
        Expected before the thread asks for the site's next job, an announcement in between is not lost."""
        expected = threading.Event()
        with self._ending:
            self._expected[site] = expected
            if self.drained:
                expected.set()
        return expected

    def unexpect(self, site: str, expected: threading.Event) -> None:
        """No longer tell ``expected`` of ``site``'s work."""
        with self._ending:
            if self._expected.get(site) is expected:
                del self._expected[site]

    def await_work(self, expected: threading.Event, seconds: float, stop: threading.Event) -> bool:
        """Wait up to ``seconds`` for ``expected`` (``expect``); True when it was set for work, False when the
        time ran out, the burst drained or ``stop`` was set (seen within SLEEPER_CHECK_EVERY)."""
        deadline = time.monotonic() + seconds
        while not (self.drained or stop.is_set()):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if expected.wait(min(left, SLEEPER_CHECK_EVERY)):
                return not self.drained
        return False

    def found_work(self, quiet_for: float | None = None) -> None:
        """A look found a job for its thread: one more thread looks (a sleeper woken, or one more
        grown when none is free), since there may be more. A watcher is left asleep: it looks
        when the first gate it was told of opens, and work that comes sooner is announced.

        ``quiet_for``: the look knew that nothing else is due for that many seconds (``Next.quiet_for``);
        the next thread to look takes the watch for that time first (``handed_watch``) instead of
        looking now to be told so.
        """
        with self._cond:
            self._busy += 1
            if quiet_for is not None and quiet_for > 0 and not self._watching:
                self._handed_until = time.monotonic() + quiet_for
            if self._sleepers:
                self._cond.notify(1)
                return
            if self._watching:
                return  # it looks when the first gate it knows of opens; nothing else is due now
            if not self._may_grow():
                return  # a thread between two jobs looks next, or the room is full
            self._starting += 1
        self._grow()

    def _may_grow(self) -> bool:
        """(Holding ``_cond``.) Whether the room grows: no thread is left free and it is not full."""
        total = self._members + self._starting
        return self.grow is not None and total - self._busy <= 0 and total < self.most

    def _grow(self) -> None:
        """One more thread (counted as starting by the caller), or the count taken back."""
        try:
            grown = self.grow() if self.grow is not None else False
        except Exception:
            log.exception("could not start one more worker thread")
            grown = False
        if not grown:
            with self._cond:
                self._starting -= 1

    def handed_watch(self) -> float:
        """Seconds this thread should watch before it looks, handed over by ``found_work``; 0 if none.
        One thread takes a hand-over; one that has run out, or found a watcher already there, is 0."""
        with self._cond:
            until, self._handed_until = self._handed_until, 0.0
            if not until or self._watching:
                return 0.0
            return max(0.0, until - time.monotonic())

    def crowded(self) -> bool:
        """Whether every thread the process may have is busy: a paced batch then ends after the
        request in flight and hands the rest back (``jobs.download``), so that a process serving
        more slow sites than it may have threads serves them all in turn."""
        return self._busy >= self.most

    def hold_thread(self) -> None:
        """This thread is busy without a look: it follows its last site to its next turn (``done_work`` after).

        Between two jobs it was free, the thread to look next if no other was: then one more is
        grown, as ``found_work`` does, so someone still looks when every thread follows a site or
        rests in a paced batch."""
        with self._cond:
            self._busy += 1
            if self._sleepers or self._watching or self._looking or not self._may_grow():
                return  # another thread looks, or the room is full
            self._starting += 1
        self._grow()

    def done_work(self) -> None:
        """The job ``found_work`` counted (or what ``hold_thread`` did) is over: its thread is free again."""
        with self._cond:
            self._busy = max(0, self._busy - 1)

    def pause(self, seconds: float, stop: threading.Event) -> bool:
        """Sleep ``seconds`` outside the room (a thread that follows its site to its next turn); True when
        it should end instead: ``end_all`` (woken at once) or ``stop`` (seen within SLEEPER_CHECK_EVERY)."""
        deadline = time.monotonic() + seconds
        with self._ending:
            while not (self.drained or stop.is_set()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._ending.wait(min(left, SLEEPER_CHECK_EVERY))
        return True

    def end_all(self) -> None:
        """The crawl is drained (a burst): every thread of the process ends its work."""
        with self._cond:
            self.drained = True
            self._cond.notify_all()
        with self._ending:
            self._ending.notify_all()
            for expected in self._expected.values():
                expected.set()
        self._poked.set()


class Shared:
    """A process's shared state for one kind of worker: its room, its timers, and what its
    threads would otherwise each build (``made``: queue objects, scheduler, lease keeper)."""

    def __init__(self) -> None:
        self.room = IdleRoom()
        self.every = Every()
        #: What the process's last drain look that found work saw first (``drain.crawl_drained``'s ``seen``).
        self.drain_saw = ""
        self._made: dict[str, Any] = {}
        self._lock = threading.Lock()

    def made(self, name: str, make: Callable[[], Any]) -> Any:
        """The object ``make()`` made for ``name`` the first time it was asked for in this process."""
        with self._lock:
            if name not in self._made:
                self._made[name] = make()
            return self._made[name]


_shared: weakref.WeakKeyDictionary[Any, dict[tuple[type, tuple[str, ...]], Shared]] = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def shared(owner: object, kind: type, sites: Sequence[str]) -> Shared:
    """The idle state shared by the workers of class ``kind`` serving ``sites`` that ``owner`` (their
    process's runtime) runs: only workers that would find the same work share a watcher."""
    with _shared_lock:
        return _shared.setdefault(owner, {}).setdefault((kind, tuple(sorted(sites))), Shared())
