"""Fetch records waiting in Redis while the database is down, written once it is back.

A job's work (a page downloaded, its body handed on) is done whether or not its
record can be written at once; redoing the job to retry the record would download
the page again. So a record the database refuses is parked in one Redis list, and
workers write parked records back in batches, oldest first, when the database
answers again. Burst workers count parked records as work left.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from . import keys, quarantine
from .errors import ConfigError
from .gate import Gate
from .store import FetchRecord

log = logging.getLogger("crawler.outbox")

#: Records written to the database in one go when the outbox is flushed.
FLUSH_BATCH = 500

_outage_logged = threading.Event()


def write(rt: Any, record: FetchRecord) -> str | None:
    """Write ``record`` to the database; when it cannot be, the record as JSON for ``park``."""
    parked = write_all(rt, [record])
    return parked[0] if parked else None


def write_all(rt: Any, records: Sequence[FetchRecord]) -> list[str]:
    """Write ``records`` to the database in one transaction; when they cannot be, each as JSON for ``park``."""
    try:
        rt.store.record_fetches(records)
        return []
    except (SQLAlchemyError, ConfigError) as exc:
        if not _outage_logged.is_set():
            _outage_logged.set()
            log.error(
                "database unavailable (%s): fetch records wait in Redis until it is back",
                str(exc).splitlines()[0][:200],
            )
        return [_to_json(record) for record in records]


def park(pipe: Any, parked: str) -> None:
    """Add a record ``write`` could not write to the outbox (in the job's own pipeline)."""
    pipe.rpush(keys.outbox(), parked)


def count_waiting(pipe: Any) -> None:
    """Queue, in ``pipe``, the count of records parked, not yet written."""
    pipe.llen(keys.outbox())


def flush(rt: Any) -> int:
    """Write fetch records that waited in Redis for the database. Returns how many were written.

    One worker at a time (a short lock), oldest first, in batches; a database still
    down leaves them waiting. Nothing is removed from Redis before it is written.
    """
    if not rt.connection.llen(keys.outbox()):
        return 0
    lock = Gate(rt.connection, "outbox", expire=60, auto_release=True, namespace=keys.PREFIX + "lock")
    if not lock.acquire(blocking=False):
        return 0
    written = 0
    try:
        while raw := rt.connection.lrange(keys.outbox(), 0, FLUSH_BATCH - 1):
            records = []
            for entry in raw:
                try:
                    records.append(_from_json(entry))
                except (ValueError, TypeError, KeyError) as exc:  # not a record this crawler parked
                    quarantine.record(
                        rt.connection, keys.outbox(), f"malformed fetch record: {exc}", content={"entry": entry}
                    )
            try:
                # A record may be there already: its write went through but its answer was
                # lost (the connection cut after the commit), so it was parked all the same.
                rt.store.record_fetches_once(records)
            except (SQLAlchemyError, ConfigError):
                return written
            rt.connection.ltrim(keys.outbox(), len(raw), -1)
            written += len(raw)
    finally:
        lock.release()
    if written:
        _outage_logged.clear()
        log.warning("database is back: %d waiting fetch records written", written)
    return written


def _to_json(record: FetchRecord) -> str:
    data = dataclasses.asdict(record)
    data["started"], data["finished"] = record.started.isoformat(), record.finished.isoformat()
    return json.dumps(data, ensure_ascii=False, default=str)


def _from_json(raw: str | bytes) -> FetchRecord:
    data = json.loads(raw)
    data["started"], data["finished"] = (datetime.fromisoformat(data[k]) for k in ("started", "finished"))
    return FetchRecord(**data)
