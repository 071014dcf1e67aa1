"""The gate: a time-limited distributed mutex per site, in the Redis::DistMutex style.

``acquire`` is ``SET <key> <token> NX PX <expire_ms>``. With ``auto_release`` off (the
gate's use) the lock is never released early: it simply expires, so at most one holder
starts per ``expire`` seconds, whatever the number of workers or hosts and however long
each holder takes. With ``auto_release`` on it is an ordinary mutex with a lease.

A blocked acquirer sleeps exactly the lock's remaining PTTL (read in the same round
trip as the failed SET), never a fixed poll.
"""

from __future__ import annotations

import functools
import secrets
import time
from collections.abc import Callable
from types import TracebackType
from typing import ParamSpec, TypeVar

from redis import Redis

P = ParamSpec("P")
R = TypeVar("R")

#: Longest sleep of a blocked acquirer of an auto-release mutex (its holder may release early).
RELEASE_POLL = 0.05

#: Default key namespace; one key per gate name below it (see ``keys.gate``).
NAMESPACE = "crawler:gate"

# KEYS[1] = lock key; ARGV[1] = token, ARGV[2] = lifetime in ms.
# Returns 0 when the lock was taken, else the remaining PTTL in ms (at least 1).
ACQUIRE_OR_PTTL = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return 0
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 1 then ttl = 1 end
return ttl
"""

# KEYS[1] = lock key; ARGV[1] = token, ARGV[2] = lifetime in ms from now.
# Restarts the lock's lifetime if the token holds it, or takes it if nobody does.
# Returns 1 (restarted), 2 (taken again after it had expired), 0 (someone else holds it).
REARM = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 1
end
if not holder then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return 2
end
return 0
"""

# KEYS[1] = lock key; ARGV[1] = token. Deletes the lock only if the token still holds it.
RELEASE_IF_OWNER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


class GateTimeout(Exception):
    """``acquire`` with a timeout could not take the gate in time."""


class Gate:
    """A named, time-limited mutex in Redis.

    ``expire`` (seconds) is the lock's lifetime: for a site's gate, its interval plus
    a safety margin plus a grace for sending. ``rearm()`` restarts the lifetime as
    ``rearm_expire`` (default ``expire``) from now: a site's gate is rearmed when its
    request is on the wire, so the interval counts from the send, not from the
    acquisition. ``auto_release`` makes the context manager and ``synchronize`` release
    on exit; otherwise the lock expires on its own.
    """

    def __init__(
        self,
        connection: Redis,
        name: str,
        expire: float,
        *,
        auto_release: bool = False,
        namespace: str = NAMESPACE,
        rearm_expire: float | None = None,
    ):
        if expire <= 0:
            raise ValueError(f"expire must be greater than 0, got {expire!r}")
        self.connection = connection
        self.name = name
        self.key = f"{namespace}:{name}"
        self.expire = expire
        self.rearm_expire = expire if rearm_expire is None else rearm_expire
        self.auto_release = auto_release
        self.token: str | None = None
        self._acquire = connection.register_script(ACQUIRE_OR_PTTL)
        self._release = connection.register_script(RELEASE_IF_OWNER)
        self._rearm = connection.register_script(REARM)

    def try_acquire(self) -> float:
        """Take the gate if open. Returns 0.0 if taken, else seconds until it opens."""
        token = secrets.token_hex(8)
        expire_ms = max(1, int(round(self.expire * 1000)))
        wait_ms = int(self._acquire(keys=[self.key], args=[token, expire_ms]))
        if wait_ms == 0:
            self.token = token
            return 0.0
        return wait_ms / 1000.0

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the gate; wait for it unless ``blocking`` is False.

        Waits at most ``timeout`` seconds (forever when None). Returns whether the
        gate was taken. Each wait is the lock's remaining PTTL.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = self.try_acquire()
            if wait == 0.0:
                return True
            if not blocking:
                return False
            # A lock not yet rearmed still counts its send grace: it may open as soon as
            # one rearm lifetime from now. A mutex (auto_release) may be released any time.
            wait = min(wait, self.rearm_expire, RELEASE_POLL if self.auto_release else wait)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                wait = min(wait, left)
            time.sleep(wait)

    def release(self) -> bool:
        """Delete the lock if this gate's token still holds it. Returns whether it did."""
        if self.token is None:
            return False
        released = bool(self._release(keys=[self.key], args=[self.token]))
        self.token = None
        return released

    def rearm(self) -> bool:
        """Restart the held lock's lifetime (``rearm_expire``) from now.

        Returns False if another holder took the gate meanwhile: the time between
        ``acquire`` and this call outlasted ``expire``, and spacing may have been lost.
        """
        if self.token is None:
            return False
        expire_ms = max(1, int(round(self.rearm_expire * 1000)))
        return int(self._rearm(keys=[self.key], args=[self.token, expire_ms])) != 0

    def locked(self) -> bool:
        """Whether anyone holds the gate now."""
        return bool(self.connection.exists(self.key))

    def remaining(self) -> float:
        """Seconds until the gate opens (0.0 if open now)."""
        ttl = int(self.connection.pttl(self.key))
        return max(ttl, 0) / 1000.0

    def __enter__(self) -> Gate:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.auto_release:
            self.release()

    def synchronize(self, fn: Callable[P, R]) -> Callable[P, R]:
        """``fn`` wrapped to run holding the gate (released after if ``auto_release``)."""

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with self:
                return fn(*args, **kwargs)

        return wrapper

    def __repr__(self) -> str:
        return f"<Gate {self.key} expire={self.expire}s auto_release={self.auto_release}>"


#: Seconds a site's gate stays closed beyond its interval until the request is sent
#: (connection set-up); the rearm at send time then counts the interval from the send.
SEND_GRACE = 0.25


def site_gate(connection: Redis, site: str, interval: float, margin: float = 0.0) -> Gate:
    """The gate that spaces requests to ``site`` by ``interval`` (+ ``margin``) seconds.

    Taken before a request, it stays closed for interval + margin + SEND_GRACE; rearmed
    when the request is sent, it then closes interval + margin from that moment.
    """
    return Gate(connection, site, interval + margin + SEND_GRACE, rearm_expire=interval + margin)
