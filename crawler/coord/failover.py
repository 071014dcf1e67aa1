"""Failover: a process's Redis found to be another server than before, and the amnesty that follows.

A Sentinel failover promotes a replica; replication is asynchronous, so the writes the old
primary took last, a site's gate among them, may be missing on the new one. A Redis
restarted from its append-only file (or without one) is the same kind of new server. Each
pool's connections are watched as they connect (``ServerWatch``, redis-py's
``redis_connect_func``): one round trip per new connection, none per command, reads the
server's ``run_id``. When it differs from the one this process saw before, or from the one
the fleet last wrote to ``keys.server()``, the server is a new one and every site's gate
is held closed for one lifetime of it (``Gate.expire``: interval, margin and send grace),
counted from the detection, before this process's next send to the site: in the process
(``Gate.try_acquire`` asks ``hold_left``), and in Redis for the gates it knows
(``HOLD_GATES``), so that processes that detect later or start just after find them closed;
``keys.server()`` then names the new server and when it was found, and a process whose first
connection comes within a hold of that holds too. The Redis clock is read again
(``redisclock`` compares ``generation``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from . import keys, lua

log = logging.getLogger("crawler.failover")

#: Gates a ``HOLD_GATES`` call closes at most (a process that knows 10,000 sites sends several).
HOLD_CHUNK = 500


@dataclass(frozen=True)
class HeldGate:
    """A gate's hold: its lifetime (ms), the pace hash that may lengthen it, and the ms added to that pace."""

    expire_ms: int
    pace_key: str | None = None
    pace_extra_ms: int = 0


class ServerWatch:
    """Which Redis server a pool's connections reach, told as each connects (``redis_connect_func``).

    Shared by the pools made from one another (``pages.named_client``): it rides in their
    ``connection_kwargs``. ``detected_at`` (``time.monotonic()``) is when this process last
    found the server to be a new one (None: never); ``generation`` counts such findings.
    """

    def __init__(self, label: str = "Redis"):
        #: How log lines name the server (a redacted URL: never a credential).
        self.label = label
        self.run_id: str | None = None
        self.detected_at: float | None = None
        self.generation = 0
        self._lock = threading.Lock()
        self._known: dict[str, HeldGate] = {}
        self._closed: set[str] = set()
        self._disabled = False

    def __call__(self, connection: Any) -> None:
        """The handshake (``on_connect``), then the server's identity (one round trip)."""
        connection.on_connect()
        if self._disabled:
            return
        replies = _ask(connection, ("INFO", "server"), ("GET", keys.server()), ("TIME",))
        if isinstance(replies[0], ResponseError):  # INFO refused (renamed, ACL): no watch
            self._disabled = True
            log.warning("%s: INFO refused (%s): a failover will not be detected", self.label, replies[0])
            return
        run_id = _info_field(replies[0], "run_id")
        if run_id is None or run_id == self.run_id:
            return
        now_ms = int(_text(replies[2][0])) * 1000 + int(_text(replies[2][1])) // 1000
        marked = None if isinstance(replies[1], Exception) or replies[1] is None else _text(replies[1]).split()
        self._found(connection, run_id, marked, now_ms)

    def _found(self, connection: Any, run_id: str, marked: list[str] | None, now_ms: int) -> None:
        """A server not seen before by this watch: the process's first, or a new one."""
        first = self.run_id is None
        if first and marked is None:  # a new crawl, or a Redis that lost everything (see RELIABILITY.md)
            _ask(connection, ("SET", keys.server(), f"{run_id} 0", "NX"))
            return self._commit(run_id, None)
        if first and marked is not None and marked[0] == run_id:
            since = int(marked[1]) if len(marked) > 1 and marked[1].isdigit() else 0
            return self._commit(run_id, time.monotonic() - (now_ms - since) / 1000 if since else None)
        detected_at = time.monotonic()
        closed = self._hold_known(connection)
        if marked is None or marked[0] != run_id:  # the first to find it says since when: the earliest
            _ask(connection, ("SET", keys.server(), f"{run_id} {now_ms}"))
        log.warning(
            "%s: a new server (run_id %s, was %s): every site's gate held closed for its interval",
            self.label,
            run_id[:12],
            (self.run_id or (marked[0] if marked else "?"))[:12],
        )
        self._commit(run_id, detected_at, closed)

    def _commit(self, run_id: str, detected_at: float | None, closed: set[str] | None = None) -> None:
        with self._lock:
            if self.run_id == run_id:  # another connection of the process found it first
                return
            self.run_id = run_id
            if detected_at is not None:
                self.detected_at = detected_at
                self._closed = closed or set()
                self.generation += 1

    def _hold_known(self, connection: Any) -> set[str]:
        """Close, in Redis, every gate this process has used, for its hold from now (``HOLD_GATES``);
        the gates closed (those of a call Redis refused are closed by their next take instead)."""
        known = list(self._known.items())
        source = lua.source("hold_gates")
        closed: set[str] = set()
        for start in range(0, len(known), HOLD_CHUNK):
            chunk = known[start : start + HOLD_CHUNK]
            gate_keys, args = hold_arguments(chunk, 0.0)
            (reply,) = _ask(connection, ("EVAL", source, len(gate_keys), *gate_keys, *args))
            if isinstance(reply, ResponseError):  # a full or read-only server: the local hold stands alone
                log.warning("%s: the gates could not be closed in Redis: %s", self.label, reply)
                break
            closed.update(key for key, _ in chunk)
        return closed

    def know(self, key: str, held: HeldGate) -> None:
        """A site gate this process takes: closed in Redis as well when a failover is found."""
        if self._known.get(key) != held:
            self._known[key] = held

    def hold_left(self, expire: float) -> float:
        """Seconds a gate of lifetime ``expire`` stays held after the last failover found (0.0: none)."""
        detected_at = self.detected_at
        if detected_at is None:
            return 0.0
        return max(0.0, detected_at + expire - time.monotonic())

    def first_hold(self, key: str) -> bool:
        """Whether ``key`` is yet to be closed in Redis for the last failover found (asked once each)."""
        with self._lock:
            if key in self._closed:
                return False
            self._closed.add(key)
            return True


def hold_arguments(gates: list[tuple[str, HeldGate]], elapsed: float) -> tuple[list[str], list[Any]]:
    """``HOLD_GATES``' keys and arguments for ``gates``, ``elapsed`` seconds into their hold."""
    gate_keys = [key for key, _ in gates]
    pace_keys: list[str] = []
    args: list[Any] = [f"failover:{time.time():.3f}", len(gates)]
    for _, held in gates:
        pace_at = 0
        if held.pace_key is not None:
            pace_keys.append(held.pace_key)
            pace_at = len(gates) + len(pace_keys)
        gone = int(elapsed * 1000)
        args += [max(0, held.expire_ms - gone), pace_at, max(0, held.pace_extra_ms - gone)]
    return gate_keys + pace_keys, args


def watch_of(connection: Any) -> ServerWatch | None:
    """The watch of ``connection``'s pool (a client or a pipeline); None when it has none (``connection.connect``
    gives one)."""
    pool = getattr(connection, "connection_pool", None)
    watch = getattr(pool, "connection_kwargs", {}).get("redis_connect_func")
    return watch if isinstance(watch, ServerWatch) else None


def generation(connection: Any) -> int:
    """How many new servers ``connection``'s pool has been found on (0 without a watch)."""
    watch = watch_of(connection)
    return 0 if watch is None else watch.generation


def _ask(connection: Any, *commands: tuple[Any, ...]) -> list[Any]:
    """``commands`` on a connection being set up, in one round trip; an error reply is returned, not raised."""
    connection.send_packed_command(connection.pack_commands(commands), check_health=False)
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(connection.read_response())
        except ResponseError as exc:
            replies.append(exc)
    return replies


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _info_field(info: Any, name: str) -> str | None:
    for line in _text(info).splitlines():
        field, _, value = line.partition(":")
        if field == name:
            return value.strip()
    return None
