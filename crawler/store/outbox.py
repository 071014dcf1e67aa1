"""Fetch records waiting in Redis while the database is down, written once it is back.

A job's work (a page downloaded, its body handed on) is done whether or not its
record can be written at once; redoing the job to retry the record would download
the page again. So a record that cannot be written while the database is down is
parked in one Redis list, and workers write parked records back in batches, oldest
first, when the database answers again. Burst workers count parked records as work left.

Only an outage parks a record. A record the database refuses (``store.refused``: a
value it cannot hold) would be refused at every try: when a batch is refused its
records are written one at a time, so the others go in; the refused one is written
as a failed record of its page with the database's reason (``crawler failed`` lists
it, ``crawler retry`` requeues it), or, if even that is refused, quarantined
(``crawler failed --quarantined``). A parked record refused when the outbox is
flushed is treated the same way, and never blocks the records behind it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from redis import Redis
from sqlalchemy.exc import SQLAlchemyError

from ..coord import keys, quarantine
from ..coord.gate import Gate
from ..errors import ConfigError, RefusedRecord
from .database import FAILED, FetchRecord, Store

log = logging.getLogger("crawler.outbox")

#: Seconds between two looks, by an idle worker, for fetch records waiting for the database.
FLUSH_EVERY = 2.0

#: Records written to the database in one go when the outbox is flushed.
FLUSH_BATCH = 500

_outage_logged = threading.Event()


def write(connection: Redis, store: Store, record: FetchRecord) -> str | None:
    """Write ``record`` to the database; when it cannot be, the record as JSON for ``park``."""
    parked = write_all(connection, store, [record])
    return parked[0] if parked else None


def write_all(connection: Redis, store: Store, records: Sequence[FetchRecord]) -> list[str]:
    """Write ``records`` to the database in one transaction; when they cannot be, each as JSON for ``park``.

    Refused (not an outage), they are written one at a time (see the module docstring);
    an outage met on the way parks the rest.
    """
    try:
        store.record_fetches(records)
        return []
    except RefusedRecord:
        pass
    except (SQLAlchemyError, ConfigError) as exc:
        _outage(exc)
        return [_to_json(record) for record in records]
    for index, record in enumerate(records):
        try:
            _write_one(connection, record, store.record_fetches, _to_json(record))
        except (SQLAlchemyError, ConfigError) as exc:
            _outage(exc)
            return [_to_json(r) for r in records[index:]]
    return []


def _write_one(connection: Redis, record: FetchRecord, write: Any, raw: str | bytes) -> None:
    """``write([record])``; refused, its page's failed record with the reason; refused again, quarantined.

    ``raw`` is what the quarantine keeps of it. Outages raise.
    """
    try:
        write([record])
        return
    except RefusedRecord as exc:
        reason = str(exc)
    log.warning("fetch record of %s refused by the database (%s): recorded failed", record.url[:200], reason[:200])
    failed = dataclasses.replace(record, outcome=FAILED, error=f"{reason} (the record of this {record.kind})")
    try:
        write([failed])
    except RefusedRecord as exc:
        reason = f"fetch record refused by the database: {exc}"
        quarantine.record(connection, keys.outbox(), reason, content={"entry": raw})


def _outage(exc: Exception) -> None:
    """Say once per outage that the database is unavailable."""
    if not _outage_logged.is_set():
        _outage_logged.set()
        log.error(
            "database unavailable (%s): fetch records wait in Redis until it is back",
            str(exc).splitlines()[0][:200],
        )


def park(pipe: Any, parked: str) -> None:
    """Add a record ``write`` could not write to the outbox (in the job's own pipeline)."""
    pipe.rpush(keys.outbox(), parked)


def count_waiting(pipe: Any) -> None:
    """Queue, in ``pipe``, the count of records parked, not yet written."""
    pipe.llen(keys.outbox())


def flush(connection: Redis, store: Store) -> int:
    """Write fetch records that waited in Redis for the database. Returns how many were written.

    One worker at a time (a short lock), oldest first, in batches; a database still
    down leaves them waiting. Nothing is removed from Redis before it is written, or,
    refused by the database, recorded failed or quarantined (``write_all``).
    """
    if not connection.llen(keys.outbox()):
        return 0
    lock = Gate(connection, "outbox", expire=60, auto_release=True, key=keys.lock("outbox"))
    if not lock.acquire(blocking=False):
        return 0
    written = 0
    try:
        while raw := connection.lrange(keys.outbox(), 0, FLUSH_BATCH - 1):
            records: list[tuple[FetchRecord, str | bytes]] = []
            for entry in raw:
                try:
                    records.append((_from_json(entry), entry))
                except (ValueError, TypeError, KeyError) as exc:  # not a record this crawler parked
                    quarantine.record(
                        connection, keys.outbox(), f"malformed fetch record: {exc}", content={"entry": entry}
                    )
            try:
                # A record may be there already: its write went through but its answer was
                # lost (the connection cut after the commit), so it was parked all the same.
                store.record_fetches_once([record for record, _ in records])
            except RefusedRecord:
                if not _flush_each(connection, store, records):
                    return written
            except (SQLAlchemyError, ConfigError):
                return written
            connection.ltrim(keys.outbox(), len(raw), -1)
            written += len(raw)
    finally:
        lock.release()
    if written:
        _outage_logged.clear()
        log.warning("database is back: %d waiting fetch records written", written)
    return written


def _flush_each(connection: Redis, store: Store, records: list[tuple[FetchRecord, str | bytes]]) -> bool:
    """A refused batch of parked records one at a time (``_write_one``); False if the database went down.

    Records written before it went down are written once anyway (``record_fetches_once``);
    one quarantined then may be quarantined again.
    """
    for record, entry in records:
        try:
            _write_one(connection, record, store.record_fetches_once, entry)
        except (SQLAlchemyError, ConfigError):
            return False
    return True


def _to_json(record: FetchRecord) -> str:
    data = dataclasses.asdict(record)
    data["started"], data["finished"] = record.started.isoformat(), record.finished.isoformat()
    return json.dumps(data, ensure_ascii=False, default=str)


def _from_json(raw: str | bytes) -> FetchRecord:
    data = json.loads(raw)
    data["started"], data["finished"] = (datetime.fromisoformat(data[k]) for k in ("started", "finished"))
    return FetchRecord(**data)
