"""Connection pools by origin: one small httpcore pool per (scheme, host, port) a process talks to.

httpcore's pool looks at every one of its connections on every request, under one lock
(a readiness poll of each idle one), so one pool for the hundreds of sites a download
process serves cost more with each site, and held threads between taking a site's gate and
sending past the gate's send grace. One pool per origin keeps that look to the origin's own
connections, as Scrapy's per-host pool does: a slow site's next request, an interval later,
reuses its connection. A pool with no request in flight, unused for ``idle_for`` seconds,
is closed and forgotten, so a long crawl over many sites holds only the pools in use.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import httpcore

#: Seconds an unused pool (and so its idle connections) is kept: past a slow site's interval.
IDLE_FOR = 30.0
#: Requests between two looks for pools to forget (each look reads every pool once).
SWEEP_EVERY = 256

#: An origin: scheme, host and port of a URL, as httpcore holds them.
Origin = tuple[bytes, bytes, int | None]


@dataclass
class _Pool:
    transport: Transport
    in_flight: int = 0
    last_used: float = field(default_factory=time.monotonic)


class Transport(Protocol):
    """An httpcore pool, or anything that sends requests as one does."""

    def handle_request(self, request: httpcore.Request) -> httpcore.Response: ...

    def close(self) -> None: ...


class OriginPools:
    """A ``Transport`` that hands each request to its origin's own pool, made by ``make`` on first use."""

    def __init__(self, make: Callable[[], Transport], idle_for: float = IDLE_FOR):
        self._make = make
        self.idle_for = idle_for
        self._pools: dict[Origin, _Pool] = {}
        self._lock = threading.Lock()
        self._requests = 0

    def __len__(self) -> int:
        """Origins with a pool now."""
        return len(self._pools)

    def handle_request(self, request: httpcore.Request) -> httpcore.Response:
        origin = (request.url.scheme, request.url.host, request.url.port)
        stale: list[_Pool] = []
        with self._lock:
            pool = self._pools.get(origin)
            if pool is None:
                pool = self._pools[origin] = _Pool(self._make())
            pool.in_flight += 1
            self._requests += 1
            if self._requests % SWEEP_EVERY == 0:
                stale = self._forget_unused()
        for unused in stale:
            unused.transport.close()
        try:
            response = pool.transport.handle_request(request)
        except BaseException:
            self._done(pool)
            raise
        assert isinstance(response.stream, Iterable)
        response.stream = _Counted(response.stream, lambda: self._done(pool))
        return response

    def _done(self, pool: _Pool) -> None:
        with self._lock:
            pool.in_flight -= 1
            pool.last_used = time.monotonic()

    def _forget_unused(self) -> list[_Pool]:
        """Drop the pools unused for ``idle_for`` with nothing in flight (the lock held); the caller closes them."""
        now = time.monotonic()
        stale = [o for o, p in self._pools.items() if p.in_flight == 0 and now - p.last_used > self.idle_for]
        return [self._pools.pop(origin) for origin in stale]

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.transport.close()


class _Counted:
    """A response's stream that tells its pool when it is closed (the request is over)."""

    def __init__(self, stream: Iterable[bytes], on_close: Callable[[], None]):
        self._stream = stream
        self._on_close: Callable[[], None] | None = on_close

    def __iter__(self) -> Iterator[bytes]:
        yield from self._stream

    def close(self) -> None:
        try:
            close = getattr(self._stream, "close", None)
            if close is not None:
                close()
        finally:
            on_close, self._on_close = self._on_close, None
            if on_close is not None:
                on_close()
