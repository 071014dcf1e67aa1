"""Pages waiting for a parser: the Redis Stream ``crawler:pages`` and its consumer group.

A download job adds one entry per HTML page (``add``: the parse task as JSON and the body,
zlib); parse workers read entries in batches through the consumer group ``parsers`` and
delete each once done with (``ack``), so the stream's length is the parse backlog. Entries
of a dead worker are claimed by another (``reclaim``) once idle past ``job_lease``; a live
worker ``touch``es those it holds; a page that killed its worker ``MAX_DELIVERIES`` times is
failed, not run again. ``beat`` says a parse worker is alive (Redis 6.2 does not renew a
consumer's idle time on an empty read). Scripts need Redis 6.2 or later. See
docs/ARCHITECTURE.md ("Pages reach the parse workers through a Redis Stream").
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis import Redis

from . import keys, lua, quarantine
from .replies import text

#: Times a worker may vanish while running one page; past that the page is failed, not run again.
MAX_DELIVERIES = 5
#: Seconds a consumer with nothing pending may stay idle before it is removed from the group.
FORGET_IDLE = 3600
#: Seconds between two signs of life of a parse worker (``beat``).
BEAT_EVERY = 5.0
#: Seconds since its last sign of life within which a parse worker counts as alive (``crawler status``).
ALIVE_WITHIN = 3 * BEAT_EVERY

#: An entry in hand: its id, its fields (task and body), and 1 + the times a worker vanished running it.
Entry = tuple[str, dict[bytes, bytes], int]


def add(connection: Any, task: dict[str, Any], body: bytes) -> None:
    """Add a page for the parse workers (connection or pipeline): its parse task and zlib-compressed ``body``."""
    connection.xadd(keys.pages(), {"task": json.dumps(task, ensure_ascii=False), "body": body})


def consumer_name() -> str:
    """A name for a new consumer: ``host:pid:random``, unique across the fleet."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def named_client(connection: Redis, name: str) -> Redis:
    """A client on ``connection``'s server whose connections carry ``name`` (``CLIENT LIST`` shows it)."""
    pool = connection.connection_pool
    kwargs = {**pool.connection_kwargs, "client_name": name}
    return Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs))


def ensure_group(connection: Redis) -> None:
    """Create the stream and its group of parse workers if missing.

    The group starts at the stream's first entry: entries are deleted once done with,
    so whatever is in the stream is still to be parsed.
    """
    try:
        connection.xgroup_create(keys.pages(), keys.PARSERS, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def is_nogroup(exc: Exception) -> bool:
    """Whether ``exc`` says the stream or its group is missing (a fresh or flushed Redis)."""
    return isinstance(exc, redis.ResponseError) and "NOGROUP" in str(exc)  # a script's error quotes it


def read(connection: Redis, consumer: str, count: int, block_ms: int) -> list[Entry]:
    """Up to ``count`` entries never delivered before, waiting up to ``block_ms`` for one."""
    try:
        reply: Any = connection.xreadgroup(keys.PARSERS, consumer, {keys.pages(): ">"}, count=count, block=block_ms)
    except redis.ResponseError as exc:
        if not is_nogroup(exc):
            raise
        ensure_group(connection)
        return []
    return [(text(entry_id), fields, 1) for _, entries in reply or [] for entry_id, fields in entries]


def reclaim(connection: Redis, consumer: str, min_idle_ms: int, count: int) -> list[Entry]:
    """Claim for ``consumer`` up to ``count`` entries pending longer than ``min_idle_ms`` (a dead holder)."""
    try:
        reply: Any = lua.script(connection, "reclaim_pages")(
            keys=[keys.pages()], args=[keys.PARSERS, consumer, min_idle_ms, count]
        )
    except redis.ResponseError as exc:
        if not is_nogroup(exc):
            raise
        ensure_group(connection)
        return []
    return [
        (text(entry_id), dict(zip(flat[::2], flat[1::2], strict=True)), int(deliveries))
        for entry_id, deliveries, flat in reply
    ]


def touch(connection: Redis, consumer: str, ids: Sequence[str]) -> set[str]:
    """Keep ``consumer``'s entries ``ids`` from being reclaimed; returns those still its own."""
    if not ids:
        return set()
    touched = lua.script(connection, "touch_pages")(keys=[keys.pages()], args=[keys.PARSERS, consumer, *ids])
    return {text(entry_id) for entry_id in touched}


def ack(pipe: Any, entry_id: str) -> None:
    """Acknowledge and delete an entry done with (in the caller's pipeline)."""
    ack_all(pipe, [entry_id])


def ack_all(pipe: Any, entry_ids: Sequence[str]) -> None:
    """Acknowledge and delete entries done with: one XACK and one XDEL for all (none if no id)."""
    if entry_ids:
        pipe.xack(keys.pages(), keys.PARSERS, *entry_ids)
        pipe.xdel(keys.pages(), *entry_ids)


@dataclass(frozen=True)
class Ack:
    """What a parse worker does with an entry once its page is recorded: ``ack`` it, in the record's
    pipeline. A write of several records sends the ``Ack``s it carries together (``ack_all``)."""

    entry_id: str

    def __call__(self, pipe: Any) -> None:
        ack(pipe, self.entry_id)


def hand_back(connection: Redis, entries: Sequence[Entry]) -> None:
    """Put entries back at the end of the stream for any worker, undelivered (one transaction)."""
    if not entries:
        return
    with connection.pipeline(transaction=True) as pipe:
        for entry_id, fields, _ in entries:
            again: dict[Any, Any] = dict(fields)
            pipe.xadd(keys.pages(), again)
            ack(pipe, entry_id)
        pipe.execute()


def refuse(connection: Redis, entry_id: str, fields: dict[bytes, bytes], reason: str) -> None:
    """Quarantine an entry that is not a page (its fields kept with ``reason``), and drop it from the stream."""
    shown = {k: f"<{len(v)} bytes>" if k == b"body" else v for k, v in fields.items()}
    with connection.pipeline(transaction=True) as pipe:
        quarantine.record(connection, keys.pages(), f"malformed page entry: {reason}", entry_id, shown, pipeline=pipe)
        ack(pipe, entry_id)
        pipe.execute()


def forget(connection: Redis, min_idle_ms: int, name: str = "") -> int:
    """Remove consumers (or the one ``name``) with nothing pending and idle for ``min_idle_ms``."""
    try:
        forget_consumers = lua.script(connection, "forget_consumers")
        return int(forget_consumers(keys=[keys.pages()], args=[keys.PARSERS, min_idle_ms, name]))
    except redis.ResponseError as exc:
        if "no such key" in str(exc).lower() or is_nogroup(exc):
            return 0
        raise


def backlog(connection: Redis) -> tuple[int, int]:
    """Entries not yet read by a parse worker, and entries read and not yet done with, in one round trip."""
    with connection.pipeline(transaction=False) as pipe:
        pipe.xlen(keys.pages())
        pipe.xpending(keys.pages(), keys.PARSERS)
        length, pending = pipe.execute(raise_on_error=False)
    held = int(pending["pending"]) if isinstance(pending, dict) else 0  # no group yet: nothing read
    total = int(length) if isinstance(length, int) else 0
    return max(total - held, 0), held


def beat(connection: Redis, consumer: str) -> None:
    """Say that parse worker ``consumer`` is alive (and forget those silent for long)."""
    now = time.time()
    with connection.pipeline(transaction=False) as pipe:
        pipe.zadd(keys.parsers(), {consumer: now})
        pipe.zremrangebyscore(keys.parsers(), "-inf", now - FORGET_IDLE)
        pipe.execute()


def leave(connection: Redis, consumer: str) -> None:
    """A parse worker stops: out of the live workers, and out of the group unless entries are pending for it."""
    connection.zrem(keys.parsers(), consumer)
    forget(connection, 0, consumer)


@dataclass(frozen=True)
class Consumer:
    """A live parse worker."""

    name: str
    pending: int  # entries it holds

    @property
    def host(self) -> str:
        return self.name.split(":", 1)[0]


def live_consumers(connection: Redis) -> list[Consumer]:
    """Parse workers alive in the last ``ALIVE_WITHIN`` seconds, with the entries each holds."""
    alive = [text(name) for name in connection.zrangebyscore(keys.parsers(), time.time() - ALIVE_WITHIN, "+inf")]
    if not alive:
        return []
    try:
        held = {text(c["name"]): int(c["pending"]) for c in connection.xinfo_consumers(keys.pages(), keys.PARSERS)}
    except redis.ResponseError:  # no stream or group yet: nothing held
        held = {}
    return [Consumer(name, held.get(name, 0)) for name in alive]
