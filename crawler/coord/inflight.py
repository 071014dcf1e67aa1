"""Which download worker processes of the fleet have jobs in hand: one command answers a drain look.

Each process notes itself in one sorted set (``keys.busy``) while its workers hold jobs,
scored by when the note lapses on the Redis clock, renewed once a second by its lease
keeper (one command a second a process, not one a job) and removed when its last job
ends. A note outlives the process that wrote it by ``NOTE_HOLDS`` at most: long enough
for the reaper to have handed back the jobs of a process that died (their lease, then
a reaper's pass; or a job stranded in RQ's intermediate list), so "no process busy"
with nothing queued means nothing is running anywhere.
"""

from __future__ import annotations

import os
import socket
import uuid

from redis import Redis

from . import keys, lua
from .reaper import REAP_EVERY, STRANDED_AFTER

#: Seconds a note holds past its last renewal, beyond a job's lease (see the module docstring).
NOTE_MARGIN = max(STRANDED_AFTER, REAP_EVERY) + REAP_EVERY + 2.0


def member() -> str:
    """A name for one keeper of one process: host, pid, and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def note_busy(connection: Redis, who: str, job_lease: float) -> None:
    """Note ``who`` busy until its jobs' lease and the reaper's margin have passed."""
    lua.script(connection, "mark_busy")(keys=[keys.busy()], args=[who, int((job_lease + NOTE_MARGIN) * 1000)])


def note_idle(connection: Redis, who: str) -> None:
    """``who`` has no job in hand any more."""
    lua.script(connection, "mark_busy")(keys=[keys.busy()], args=[who, 0])


def busy_processes(connection: Redis) -> int:
    """How many processes have jobs in hand (or died holding some, not yet reaped)."""
    return int(lua.script(connection, "count_busy")(keys=[keys.busy()]))
