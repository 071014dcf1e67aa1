"""What happens when a job is done: one fetch record, its counts, one log line.

Every download and parse ends in ``job_done`` (or has its record written with others':
``HeldRecords``, ``RecordWriter``): the record goes to the ``fetches``
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
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis import Redis

from ..coord import pages
from ..coord.counters import Counters
from ..store import outbox
from ..store.database import FetchRecord, Store

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


@dataclass(frozen=True)
class RecordSink:
    """Where a job's record goes: the database (``store``; Redis's outbox while it is down), the
    job's own Redis pipeline (``connection``), and the process's counters."""

    connection: Redis
    store: Store
    counters: Counters


def job_done(
    sink: RecordSink,
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
    jobs_done(sink, [Done(record, gate_wait, also, stats)])


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
    #: The page entry this record's page came from (a parse's), acknowledged with the others of
    #: the write, after every record's commands: one XACK and one XDEL for all (``pages.ack_all``).
    ack: str | None = None


def jobs_done(sink: RecordSink, done: Sequence[Done], written: bool = False) -> None:
    """``job_done`` for several records at once: one database transaction, one Redis pipeline, in order.

    ``written``: the records are in the database already (``parse_job.HeldParses`` writes
    them with the items, in one transaction); only the pipeline is left. On an error none
    is counted, and the first error is raised.
    """
    error = _write_groups(sink, [done], written)[0] if done else None
    if error is not None:
        raise error


def _write_groups(
    sink: RecordSink, groups: Sequence[Sequence[Done]], written: bool = False
) -> list[BaseException | None]:
    """Write the records of every group in one transaction and one pipeline, in order; each group's
    error (the first error reply to its commands, or an error of the whole write), None for those
    that went, which are counted and logged. A group is counted whole or not at all."""
    flat = [d for group in groups for d in group]
    parked = [] if written else outbox.write_all(sink.connection, sink.store, [d.record for d in flat])
    with sink.connection.pipeline(transaction=False) as pipe:
        spans = []
        for d in flat:
            start = len(pipe)
            if d.also is not None:
                d.also(pipe)
            spans.append((start, len(pipe)))
        parked_from = len(pipe)
        for entry in parked:
            outbox.park(pipe, entry)
        pages.ack_all(pipe, [d.ack for d in flat if d.ack is not None])
        replies = pipe.execute(raise_on_error=False)  # no round trip when empty
    for d, (start, end) in zip(flat, spans, strict=True):
        if d.check is not None:  # called even with no reply: a rider that had nothing to send rode too
            replies[start:end] = d.check(replies[start:end])
    # A record parked but not in Redis, or an acknowledgement refused, is every group's: none is told it went.
    lost = next((reply for reply in replies[parked_from:] if isinstance(reply, Exception)), None)
    errors: list[BaseException | None] = []
    at = 0
    for group in groups:
        group_spans = spans[at : at + len(group)]
        at += len(group)
        error = lost
        for start, end in group_spans:
            error = error or next((r for r in replies[start:end] if isinstance(r, Exception)), None)
        errors.append(error)
        if error is None:
            for d in group:
                sink.counters.add(d.record.site, d.stats, job_fields(d.record, d.gate_wait))
                if log.isEnabledFor(logging.INFO):
                    log.info(summary(d.record, d.gate_wait), extra={"job": fields(d.record, d.gate_wait)})
    return errors


#: Bytes of held pages' bodies past which a batch writes its held records at once.
HELD_BYTES = 4 * 1024 * 1024


class HeldRecords:
    """Records of one batch job held back and written together (``jobs_done``) when ``flush``ed.

    What a record's ``also`` sends (a page handed to the parse workers, above all) goes
    out with it, after it is written, never before.
    """

    #: Whether a record goes within its batch, soon enough to carry its gate's rearm: not here.
    prompt = False

    def __init__(self, sink: RecordSink):
        self.sink = sink
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
        jobs_done(self.sink, held)


#: Longest a paced batch's record waits for others to be written with (``RecordWriter``).
WRITE_WITHIN = 0.05


class _Ticket:
    """One record handed to a ``RecordWriter``: set once it is written, with its error if it was not."""

    __slots__ = ("error", "written")

    def __init__(self) -> None:
        self.written = threading.Event()
        self.error: BaseException | None = None


class RecordWriter:
    """Writes the records this process's threads hand it together: one transaction and one pipeline
    (``_write_groups``) for all that are waiting, as soon as the first of them is due.

    A paced batch's thread rests up to its interval between requests, so its record can wait
    a little for others (``SoonRecords``) rather than take a transaction and a round trip of its
    own. One writer thread a process, started at the first record (in a forked process too:
    the thread stays in the parent); a record's error goes back to the thread that handed it
    (``SoonRecords.flush``), and is the only one it gets.
    """

    def __init__(self, sink: RecordSink):
        self.sink = sink
        self._changed = threading.Condition()
        self._waiting: list[tuple[Done, _Ticket]] = []
        self._due = math.inf
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._closing = False

    def submit(self, done: Done, by: float) -> _Ticket:
        """Hand ``done`` to be written by ``by`` (``time.monotonic()``) at the latest; its ticket."""
        ticket = _Ticket()
        with self._changed:
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid, self._closing = os.getpid(), False
                self._thread = threading.Thread(target=self._run, name="record-writer", daemon=True)
                self._thread.start()
            self._waiting.append((done, ticket))
            if by < self._due:
                self._due = by
                self._changed.notify()
        return ticket

    def close(self) -> None:
        """Write what waits, and end the writer thread (a later ``submit`` starts another)."""
        with self._changed:
            thread = self._thread if self._pid == os.getpid() else None
            self._closing, self._due = True, -math.inf
            self._changed.notify()
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not (self._closing and not self._waiting) and (not self._waiting or time.monotonic() < self._due):
                    self._changed.wait(None if not self._waiting else self._due - time.monotonic())
                if not self._waiting:
                    return  # closing, nothing left
                taken, self._waiting = self._waiting, []
                self._due = -math.inf if self._closing else math.inf
            self.write(taken)

    def write(self, taken: Sequence[tuple[Done, _Ticket]]) -> None:
        """Write ``taken`` together and settle their tickets, whatever happens (nothing raises here)."""
        try:
            errors = _write_groups(self.sink, [[done] for done, _ in taken])
        except BaseException as exc:  # noqa: BLE001  # an outage of the whole write: every record's error
            errors = [exc] * len(taken)
        for (_, ticket), error in zip(taken, errors, strict=True):
            ticket.error = error
            ticket.written.set()


class SoonRecords:
    """A paced batch's records, handed to its process's ``RecordWriter`` and written within
    WRITE_WITHIN, before ``by()`` (when the batch's next request is prepared); ``flush``
    waits for them. Same use as ``HeldRecords``, but what a record's ``also`` sends (the
    rearm of its gate, its page to the parse workers) goes within the batch, not at its end.
    """

    prompt = True

    def __init__(self, writer: RecordWriter, by: Callable[[], float]):
        self.writer = writer
        self.by = by
        self.tickets: list[_Ticket] = []
        self._rider: Callable[[Any], Callable[[list[Any]], None]] | None = None

    def ride(self, rider: Callable[[Any], Callable[[list[Any]], None]] | None) -> None:
        """Send ``rider``'s commands in the write of the next record added (given the pipeline, it
        queues them and returns what takes their replies, called once they are in); ``None``:
        nothing. A record that never comes, or goes at once on its own (a retry), takes none."""
        self._rider = rider

    def add(self, done: Done) -> None:
        rider, self._rider = self._rider, None
        if rider is not None:
            done = _riding(done, rider)
        self.tickets.append(self.writer.submit(done, min(time.monotonic() + WRITE_WITHIN, self.by())))

    def flush(self) -> None:
        """Wait until every record added is written; raise the first error among them."""
        tickets, self.tickets = self.tickets, []
        for ticket in tickets:
            ticket.written.wait()
        error = next((ticket.error for ticket in tickets if ticket.error is not None), None)
        if error is not None:
            raise error


def write_now(writer: RecordWriter, done: Done) -> None:
    """``job_done`` through the process's ``writer`` (``Runtime.record_writer``): due at once, so
    written in its next transaction and pipeline together with whatever other threads hand it
    meanwhile, and waited for; its error raised, as ``jobs_done`` raises it. For a job's record
    that no batch holds (a job of one URL, robots.txt), so threads do not queue one by one for
    the database's writer.
    """
    soon = SoonRecords(writer, time.monotonic)
    soon.add(done)
    soon.flush()


def _riding(done: Done, rider: Callable[[Any], Callable[[list[Any]], None]]) -> Done:
    """``done`` with ``rider``'s commands queued after its own, and their replies handed to what
    ``rider`` returned (unless one is an error: the write's error then goes to the batch)."""
    own: list[int] = []
    kept: list[Callable[[list[Any]], None]] = []

    def also(pipe: Any) -> None:
        start = len(pipe)
        if done.also is not None:
            done.also(pipe)
        own.append(len(pipe) - start)
        kept.append(rider(pipe))

    def check(replies: list[Any]) -> list[Any]:
        mine, theirs = replies[: own[-1]], replies[own[-1] :]
        if done.check is not None and mine:
            mine = done.check(mine)
        if not any(isinstance(reply, Exception) for reply in theirs):
            kept[-1](theirs)
        return [*mine, *theirs]

    return Done(done.record, done.gate_wait, also, done.stats, check)


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
