"""One Redis subscription per worker process: RQ's commands to its workers, and the crawl's wake-ups.

RQ gives each worker a subscription and a thread of its own to hear ``rq``'s commands
(shutdown, kill-horse, stop-job) on ``rq:pubsub:NAME``: a process of hundreds of worker
threads would hold hundreds of connections and threads for messages that seldom come.
Here one connection per process subscribes to every worker's channel by pattern, to
``keys.wake()``, on which the crawl announces a site that got work
(``scheduler.mark_ready``), and to ``keys.more_work()``, on which it announces more work of
a site already in the ready set (``Frontier.push``); one thread hands each command to the
worker it names, each wake-up to the process's idle rooms (``idle.IdleRoom.poke``), so an
idle process sleeps until work comes instead of looking for it, and each more-work to the
thread that follows that site, if any (``idle.IdleRoom.tell``). The subscription lives while the
process has a worker registered with it.

Anyone who can write to Redis can publish on these channels: a message that does not hold
(not JSON, not a command, bytes that are not UTF-8, megabytes of it) is ignored, the first
of each channel logged as a warning (the others at debug level), and the thread goes on
serving; so does it after any other error but a lost connection, which it waits out.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import redis
from redis import Redis
from redis.client import PubSub
from rq.worker.base import PUBSUB_CHANNEL_TEMPLATE

from ..coord import keys
from .idle import IdleRoom

log = logging.getLogger("crawler.workers")

#: Seconds the listening thread waits before it subscribes again after losing Redis.
RECONNECT_AFTER = 2.0
#: Seconds it waits after another error before it listens again (an error that comes back is not a busy loop).
ERROR_PAUSE = 0.1
#: Longest read of the subscription, seconds: an idle process's listener wakes this seldom.
LISTEN_WAIT = 60.0


class Listener:
    """The process's subscription for one Redis client; ``register`` a worker, ``unregister`` it when done."""

    def __init__(self, connection: Redis):
        self._connection = connection
        self._lock = threading.Lock()
        self._workers: dict[str, Any] = {}
        self._rooms: weakref.WeakSet[IdleRoom] = weakref.WeakSet()
        self._pubsub: PubSub | None = None
        self._thread: ListeningThread | None = None
        self._prefix = PUBSUB_CHANNEL_TEMPLATE % ""
        #: What was warned about already: "command", "wake", "more-work" (malformed messages), errors' types.
        self._warned: set[str] = set()

    def register(self, worker: Any, room: IdleRoom | None = None) -> None:
        """Hand ``worker`` the commands sent to its channel, and ``room`` the wake-ups, from now on."""
        with self._lock:
            self._workers[worker.name] = worker
            if room is not None:
                self._rooms.add(room)
            if self._thread is None:
                self._start()

    def unregister(self, worker: Any) -> None:
        """Stop handing ``worker`` its commands; the last one out ends the subscription."""
        with self._lock:
            self._workers.pop(worker.name, None)
            if self._workers or self._thread is None:
                return
            thread, pubsub = self._thread, self._pubsub
            self._thread = self._pubsub = None
        assert pubsub is not None
        thread.running.clear()  # first: the replies below wake it from its read, and it must see it was stopped
        try:
            pubsub.punsubscribe()
            pubsub.unsubscribe()
        except redis.RedisError:
            pass
        if thread is not threading.current_thread():
            thread.join(timeout=1)
        pubsub.close()

    def _start(self) -> None:
        pubsub = self._connection.pubsub(ignore_subscribe_messages=True)
        pubsub.psubscribe(**{f"{self._prefix}*": self._guarded("command", self._command)})
        pubsub.subscribe(
            **{
                keys.wake(): self._guarded("wake", self._wake),
                keys.more_work(): self._guarded("more-work", self._more_work),
            }
        )
        self._pubsub = pubsub
        self._thread = ListeningThread(pubsub, self._on_error)
        self._thread.start()

    def _guarded(self, kind: str, handle: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
        """``handle``, but a message it cannot take is ignored (``_ignore``) rather than ending the thread."""

        def guarded(message: dict[str, Any]) -> None:
            try:
                handle(message)
            except Exception as exc:  # anyone may publish anything: RQ's parse, a worker's command handling
                self._ignore(kind, message, exc)

        return guarded

    def _ignore(self, kind: str, message: dict[str, Any], exc: Exception) -> None:
        """Log a malformed ``kind`` message: the first as a warning, later ones at debug level."""
        level = logging.DEBUG if kind in self._warned else logging.WARNING
        self._warned.add(kind)
        channel = _text(message.get("channel"))
        log.log(level, "ignored a malformed %s message on %.100s: %s: %.200s", kind, channel, type(exc).__name__, exc)

    def _command(self, message: dict[str, Any]) -> None:
        name = _text(message["channel"])[len(self._prefix) :]
        worker = self._workers.get(name)  # commands to other processes' workers reach us too
        if worker is not None:
            worker.handle_payload(message)

    def _wake(self, message: dict[str, Any]) -> None:
        site = _site_of(message)
        for room in list(self._rooms):
            room.poke(site)

    def _more_work(self, message: dict[str, Any]) -> None:
        site = _site_of(message)
        if site is not None:
            for room in list(self._rooms):
                room.tell(site)

    def _on_error(self, exc: BaseException, thread: ListeningThread) -> None:
        # redis-py subscribes again once the connection is back; meanwhile the workers' own
        # looks (at least one a second when idle) still find work.
        if thread is not self._thread:
            return  # stopped (``unregister``): its connection was closed under it
        if isinstance(exc, redis.ConnectionError):
            time.sleep(RECONNECT_AFTER)
            return
        if not isinstance(exc, Exception):
            raise exc  # SystemExit and the like: not ours to swallow
        # Anything else (a reply redis-py cannot read): kept serving, said once per kind of error.
        level = logging.DEBUG if type(exc).__name__ in self._warned else logging.WARNING
        self._warned.add(type(exc).__name__)
        log.log(
            level, "the subscription for commands and wake-ups met %s: %.200s; listening on", type(exc).__name__, exc
        )
        time.sleep(ERROR_PAUSE)


class ListeningThread(threading.Thread):
    """Hands the subscription's messages to their handlers until ``running`` is cleared, then closes it.

    redis-py's ``run_in_thread`` loop with a stop that does not wait: ``PubSubWorkerThread.stop`` (redis-py
    8.2) joins its thread, which, stopped just as the subscription ends, waits a whole read (LISTEN_WAIT)
    for a subscription that will not come, and the process's exit with it.
    """

    def __init__(self, pubsub: PubSub, on_error: Callable[[BaseException, ListeningThread], None]):
        super().__init__(name="crawler-listener", daemon=True)
        self.pubsub = pubsub
        self.running = threading.Event()
        self.running.set()
        self._on_error = on_error

    def run(self) -> None:
        while self.running.is_set():
            try:
                self.pubsub.get_message(ignore_subscribe_messages=True, timeout=LISTEN_WAIT)
            except BaseException as exc:
                self._on_error(exc, self)
        self.pubsub.close()


def _text(value: Any) -> str:
    """A channel name or payload as text: bytes decoded as UTF-8, invalid bytes replaced."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _site_of(message: dict[str, Any]) -> str | None:
    """The site a wake-up or more-work message names (anyone may publish: None when it names none)."""
    data = message.get("data")
    return data.decode(errors="replace") if isinstance(data, bytes) else data if isinstance(data, str) else None


_listeners: weakref.WeakKeyDictionary[Redis, Listener] = weakref.WeakKeyDictionary()
_listeners_lock = threading.Lock()


def of(connection: Redis) -> Listener:
    """The process's listener for ``connection`` (one per Redis client)."""
    with _listeners_lock:
        found = _listeners.get(connection)
        if found is None:
            found = _listeners[connection] = Listener(connection)
        return found
