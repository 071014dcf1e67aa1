"""What happens when a job is done: one fetch record, its counts, one log line.

Every download and parse ends in ``job_done``: the record goes to the ``fetches``
table, the job's stats and metrics (``job_fields``: the fields of
``crawler:metrics:SITE`` that ``ops.metrics`` serves) to its process's counters
(``counters``: written to Redis about once a second), and one line to the
``crawler.job`` logger, a JSON object per line when the worker runs with
``--log-format json``, so logs can be shipped elsewhere as they are.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..store import outbox
from ..store.database import FetchRecord

log = logging.getLogger("crawler.job")

#: Upper bounds (seconds) of the download and parse duration histogram buckets.
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, math.inf)
#: Upper bounds (seconds) of the gate-wait histogram buckets (Retry-After and error pauses reach minutes).
GATE_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, math.inf)


def job_fields(record: FetchRecord, gate_wait: float | None = None) -> dict[str, int | float]:
    """The increments of ``keys.metrics(record.site)`` that count one finished job.

    The job (1 field), its bytes (when it has a body), its duration (when it has one:
    bucket and sum) and its gate wait (downloads that took the gate): at most 6 fields
    for a download, 3 for a parse. Sums are floats, counts ints.
    """
    status = "none" if record.status is None else str(record.status)
    fields: dict[str, int | float] = {f"req:{record.kind}:{record.outcome}:{status}": 1}
    if record.bytes is not None:
        fields[f"bytes:{record.kind}"] = record.bytes
    if record.elapsed is not None:
        _observe(fields, f"dur:{record.kind}", DURATION_BUCKETS, record.elapsed)
    if gate_wait is not None:
        _observe(fields, "gate", GATE_WAIT_BUCKETS, gate_wait)
    return fields


def _observe(fields: dict[str, int | float], prefix: str, bounds: tuple[float, ...], value: float) -> None:
    value = max(0.0, float(value))
    bound = bounds[bisect.bisect_left(bounds, value)]  # the first bucket whose bound is >= value
    fields[f"{prefix}:{bound_name(bound)}"] = 1
    fields[f"{prefix}:sum"] = value


def bound_name(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else f"{bound:g}"


def job_done(
    rt: Any,
    record: FetchRecord,
    gate_wait: float | None = None,
    also: Callable[[Any], None] | None = None,
    stats: Mapping[str, int] | None = None,
) -> None:
    """Record ``record`` in the database (or, while it is down, in Redis: see ``outbox``), count it, log it.

    ``also`` adds the caller's own Redis commands to the one pipeline a job sends (none
    is sent when it has nothing to say); ``stats`` are the job's fields of the site's
    stats hash. Both are counted once that pipeline has gone: a job whose pipeline
    failed is run again, and counted then.
    """
    jobs_done(rt, [Done(record, gate_wait, also, stats)])


@dataclass(frozen=True)
class Done:
    """One request's record, as ``job_done`` takes it."""

    record: FetchRecord
    gate_wait: float | None = None
    also: Callable[[Any], None] | None = None
    stats: Mapping[str, int] | None = None
    #: Takes the replies to ``also``'s commands and gives them back, errors it dealt with replaced
    #: (``Gate.rearm_sent``); any error left is raised once the whole pipeline has run.
    check: Callable[[list[Any]], list[Any]] | None = None


def jobs_done(rt: Any, done: Sequence[Done], written: bool = False) -> None:
    """``job_done`` for several records at once: one database transaction, one Redis pipeline, in order.

    ``written``: the records are in the database already (``jobs.HeldParses`` writes
    them with the items, in one transaction); only the pipeline is left.
    """
    if not done:
        return
    parked = [] if written else outbox.write_all(rt, [d.record for d in done])
    with rt.connection.pipeline(transaction=False) as pipe:
        spans = []
        for d in done:
            start = len(pipe)
            if d.also is not None:
                d.also(pipe)
            spans.append((start, len(pipe)))
        for entry in parked:
            outbox.park(pipe, entry)
        replies = pipe.execute(raise_on_error=False)  # no round trip when empty
    for d, (start, end) in zip(done, spans, strict=True):
        if d.check is not None and end > start:
            replies[start:end] = d.check(replies[start:end])
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    for d in done:
        rt.counters.add(d.record.site, d.stats, job_fields(d.record, d.gate_wait))
        if log.isEnabledFor(logging.INFO):
            log.info(summary(d.record, d.gate_wait), extra={"job": fields(d.record, d.gate_wait)})


#: Bytes of held pages' bodies past which a batch writes its held records at once.
HELD_BYTES = 4 * 1024 * 1024


class HeldRecords:
    """Records of one batch job held back and written together (``jobs_done``) when ``flush``ed.

    What a record's ``also`` sends (a page handed to the parse workers, above all) goes
    out with it, after it is written, never before.
    """

    def __init__(self, rt: Any):
        self.rt = rt
        self.held: list[Done] = []
        self._bytes = 0

    def add(self, done: Done) -> None:
        """Hold ``done``; write all that is held once their bodies pass HELD_BYTES (memory stays bounded)."""
        self.held.append(done)
        self._bytes += done.record.bytes or 0
        if self._bytes >= HELD_BYTES:
            self.flush()

    def flush(self) -> None:
        held, self.held, self._bytes = self.held, [], 0
        jobs_done(self.rt, held)


def fields(record: FetchRecord, gate_wait: float | None = None) -> dict[str, Any]:
    """The record as plain JSON-ready fields (the structured log line)."""
    data: dict[str, Any] = {
        "kind": record.kind,
        "site": record.site,
        "url": record.url,
        "outcome": record.outcome,
        "status": record.status,
        "bytes": record.bytes,
        "elapsed_ms": None if record.elapsed is None else round(record.elapsed * 1000, 1),
        "attempt": record.attempt,
        "worker": record.worker,
        "callback": record.callback,
    }
    if gate_wait is not None:
        data["gate_wait_ms"] = round(gate_wait * 1000, 1)
    if record.error:
        data["error"] = record.error.strip().splitlines()[-1][:500]
    return {k: v for k, v in data.items() if v is not None}


def summary(record: FetchRecord, gate_wait: float | None = None) -> str:
    """The same job in one human-readable line."""
    elapsed = "" if record.elapsed is None else f" {record.elapsed * 1000:.0f}ms"
    status = "" if record.status is None else f" {record.status}"
    error = f" ({record.error.strip().splitlines()[-1][:200]})" if record.error else ""
    return f"{record.kind} {record.outcome}{status}{elapsed} {record.url}{error}"


class JSONFormatter(logging.Formatter):
    """One JSON object per log record; job lines carry their fields at the top level."""

    converter = time.gmtime  # type: ignore[assignment]  # typeshed wants an argument; gmtime takes it

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "process": record.processName,
        }
        job = getattr(record, "job", None)
        if isinstance(job, dict):
            data.update(job)
        else:
            data["message"] = record.getMessage()
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:  # formatted (and scrubbed of secrets) by the handler's filter
            data["exception"] = record.exc_text
        return json.dumps(data, ensure_ascii=False, default=str)
