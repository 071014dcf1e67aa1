"""Turns at a SQLite database's one writer: threads and processes queue for it instead of polling.

SQLite lets one transaction write at a time, and a writer that finds the lock taken polls
for it (its busy handler), sleeping up to 100 ms between tries. A ``WriteTurns`` makes
writers queue instead: the threads of a process on a lock, the processes on an exclusive
``flock`` of a file beside the database (``<database>-writer``), each let in as soon as the
one before commits. A process that dies loses its lock; one frozen in its turn holds the
others up TURN_WAIT at most, then SQLite's own wait decides (its busy timeout, then the
records wait in Redis: ``outbox``).

SQLite's automatic WAL checkpoint, which holds a writer's turn while it copies the log, is
off (``PRAGMA wal_autocheckpoint=0``, set by ``database``): a process runs a PASSIVE one,
which other writers do not wait for, after every CHECKPOINT_EVERY of its write
transactions, outside its turn.

PostgreSQL needs none of this: ``Store`` takes no turn there.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO

from ..backoff import Backoff

log = logging.getLogger("crawler.store")

#: Longest wait for a turn, seconds: past it a writer goes ahead without one (a holder frozen).
TURN_WAIT = 5.0
#: First pause between two asks for the file's lock, seconds; each next one doubles, up to ASK_EVERY.
ASK_FIRST = 0.0005
#: Longest pause between two asks for the file's lock, seconds.
ASK_EVERY = 0.004

#: A process's write transactions between two of its WAL checkpoints. A transaction writes a
#: few pages (a record, a batch's items), so the log stays within a few thousand pages.
CHECKPOINT_EVERY = 200


class WriteTurns:
    """Turns at the writer of the SQLite database file ``database`` (see the module docstring).

    ``checkpoint`` runs a PASSIVE WAL checkpoint (on a connection of its own); it is called
    outside any turn. Safe to share between threads; a forked process gets its own lock and
    its own open file (a ``flock`` is held per open file, which a fork would share).
    """

    def __init__(self, database: str | None, checkpoint: Callable[[], None]):
        self._path = f"{database}-writer" if database and database != ":memory:" else None
        self._checkpoint = checkpoint
        self._pid = 0
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None
        self._writes = 0
        self._guard = threading.Lock()  # for the fork check and the count

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Hold the writer's turn for the ``with`` block (a write transaction, committed in it)."""
        lock, file = self._own()
        deadline = time.monotonic() + TURN_WAIT
        locked = lock.acquire(timeout=TURN_WAIT)
        try:
            flocked = file if file is not None and _flock_by(file, deadline) else None
            try:
                yield
            finally:
                if flocked is not None:
                    fcntl.flock(flocked, fcntl.LOCK_UN)
        finally:
            if locked:
                lock.release()
        self._count()

    def _own(self) -> tuple[threading.Lock, IO[bytes] | None]:
        """This process's lock and lock file (made anew after a fork); no file if it cannot be opened."""
        with self._guard:
            if self._pid != os.getpid():
                self._pid, self._lock, self._writes = os.getpid(), threading.Lock(), 0
                self._file = self._open()
            return self._lock, self._file

    def _open(self) -> IO[bytes] | None:
        if self._path is None:
            return None
        try:
            return open(self._path, "ab")  # noqa: SIM115  # held for the process's life
        except OSError as exc:  # a read-only directory: the threads still queue, the processes poll
            log.warning("cannot open %s (%s): processes wait for SQLite's lock by polling", self._path, exc)
            return None

    def _count(self) -> None:
        with self._guard:
            self._writes += 1
            due = self._writes % CHECKPOINT_EVERY == 0
        if due:
            try:
                self._checkpoint()
            except Exception as exc:  # noqa: BLE001  # the next one tries again; SQLite's data is safe meanwhile
                log.warning("WAL checkpoint failed: %s", str(exc).splitlines()[0][:200])


def _flock_by(file: IO[bytes], deadline: float) -> bool:
    """Take ``file``'s exclusive lock, asking again until ``deadline`` (``time.monotonic()``); whether it was."""
    pauses = Backoff(ASK_FIRST, ASK_EVERY)
    while True:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                log.warning("the SQLite writer's turn was not free for %.0f s: writing without it", TURN_WAIT)
                return False
            time.sleep(pauses.next())
