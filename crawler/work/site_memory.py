"""What a process remembers of each site between its jobs: the small mutable per-site state.

Jobs get their site's settings as values (``jobs.context.SiteContext``); what changes as they
run, and what the next job of the site needs from the last one, is kept here, in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..coord import keys
from ..coord.gate import Turn


@dataclass
class SiteMemory:
    """Per-site state shared by a process's threads. Plain dicts, each read and written by key (atomic
    in CPython): threads of many sites never queue on a lock to read them."""

    #: The gate's key -> this process's turn at it (``gate.Turn``): its threads take a gate in turn.
    turns: dict[str, Turn] = field(default_factory=dict)
    #: Site -> seconds its last answer took in full (``inf``: none came), for the rearm and the batching.
    answer_times: dict[str, float] = field(default_factory=dict)
    #: Site -> until when (``time.monotonic()``) its jobs carry one URL (``batching.late_batch``).
    unbatched_until: dict[str, float] = field(default_factory=dict)
    #: Site -> the address gate last written to its conf for NEXT_JOB (``gate_by = "ip"``).
    gate_hints: dict[str, str] = field(default_factory=dict)
    #: Site -> when its policy was last looked at for publishing (``Runtime.publish``).
    published: dict[str, float] = field(default_factory=dict)
    #: Site -> (when, what) this process last wrote of its conf.
    conf_written: dict[str, tuple[float, tuple[object, ...]]] = field(default_factory=dict)
    #: Site -> whether a run of its errors may stand in Redis (``keys.errors``), as read at this process's
    #: last claim of a job of the site or written here since; absent: not known. A success ends a run
    #: (a DEL) only when there may be one. Exact for a site of concurrency 1 (its one job at a time
    #: reads it at its claim); with more, a run another process starts meanwhile outlives a success here
    #: until the next claim of the site reads it.
    error_runs: dict[str, bool] = field(default_factory=dict)

    def claim_reads(self, pipe: Any, site: str) -> Callable[[list[Any]], None]:
        """Queue in ``pipe`` (a job's claim) the read of whether ``site`` has a run of errors; what keeps
        its reply, given the replies from this command on."""
        pipe.exists(keys.errors(site))

        def keep(replies: list[Any]) -> None:
            self.error_runs[site] = bool(replies[0])

        return keep

    def turn(self, gate_key: str) -> Turn:
        """This process's turn at the gate ``gate_key``, made on first use."""
        return self.turns.get(gate_key) or self.turns.setdefault(gate_key, Turn())  # atomic: no lock
