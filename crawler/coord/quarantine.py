"""Work refused as unsafe or malformed: kept aside with its reason, never run, never dropped.

Anyone who can write to Redis can write a job hash or a frontier entry. What the
crawler cannot trust (a job naming another function, fields that do not parse, a
download off the spider's domains, a frontier entry that is not an entry) is moved
here: the job leaves its queue and registries, and a copy of what it held (each field
cut to ``KEEP_CHARS``) is kept in one capped list with the reason, where ``crawler
failed`` shows it. The worker that met it goes on with the next job.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from redis import Redis
from rq import Queue
from rq.job import Job

from . import keys  # vetting imports this module: nothing of vetting here

log = logging.getLogger("crawler.quarantine")

#: Entries kept; the oldest go first.
MAX_ENTRIES = 10_000
#: Characters kept of each field of a quarantined job or entry.
KEEP_CHARS = 500


@dataclass(frozen=True)
class Quarantined:
    """One refused job or frontier entry."""

    when: float  # Unix time
    source: str  # the RQ queue, or the frontier list it came from
    reason: str
    job_id: str | None = None
    content: dict[str, str] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "when": self.when,
            "source": self.source,
            "reason": self.reason,
            "job_id": self.job_id,
            "content": self.content,
        }


def _text(value: Any) -> str:
    text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
    return text if len(text) <= KEEP_CHARS else text[:KEEP_CHARS] + "…"


def record(
    connection: Redis,
    source: str,
    reason: str,
    job_id: str | None = None,
    content: dict[Any, Any] | None = None,
    pipeline: Any = None,
) -> None:
    """Keep ``content`` aside with ``reason`` (in ``pipeline`` when given)."""
    entry = Quarantined(
        time.time(), source, reason, job_id, {_text(k): _text(v) for k, v in (content or {}).items()} or None
    )
    pipe = pipeline if pipeline is not None else connection.pipeline(transaction=False)
    pipe.lpush(keys.quarantine(), json.dumps(entry.as_dict(), ensure_ascii=False))
    pipe.ltrim(keys.quarantine(), 0, MAX_ENTRIES - 1)
    if pipeline is None:
        pipe.execute()
    log.warning("quarantined %s from %s: %s", f"job {job_id}" if job_id else "an entry", source, reason)


def job(connection: Redis, queue_name: str, job_id: str, reason: str, content: dict[Any, Any]) -> bool:
    """Take job ``job_id`` out of its queue and its hash out of Redis, keeping ``content`` with ``reason``.

    Whoever deletes the hash records it, so a job met by two workers at once is kept once.
    Returns whether this call did. The id may stay in a registry or intermediate list,
    where RQ drops it as a job that no longer exists.
    """
    if not connection.delete(Job.key_for(job_id)):
        return False
    queue = Queue(queue_name, connection=connection)
    with connection.pipeline(transaction=False) as pipe:
        pipe.lrem(queue.key, 0, job_id)
        pipe.lrem(queue.intermediate_queue_key, 0, job_id)
        record(connection, queue_name, reason, job_id, content, pipeline=pipe)
        pipe.execute()
    return True


def entries(connection: Redis, limit: int | None = None) -> list[Quarantined]:
    """The quarantined jobs and entries, newest first."""
    raw = connection.lrange(keys.quarantine(), 0, -1 if limit is None else limit - 1)
    found = []
    for item in raw:
        try:
            data = json.loads(item)
            found.append(
                Quarantined(
                    float(data["when"]),
                    str(data["source"]),
                    str(data["reason"]),
                    data.get("job_id"),
                    data.get("content"),
                )
            )
        except (ValueError, KeyError, TypeError):  # written by hand: shown as it is
            found.append(Quarantined(0.0, "?", _text(item)))
    return found


def count(connection: Redis) -> int:
    return int(connection.llen(keys.quarantine()))
