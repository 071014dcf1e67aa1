"""The development HTTP cache: re-running a spider being written replays pages instead of refetching them.

Opt-in (``http_cache`` setting, ``--http-cache`` flag). ``CachingFetcher`` wraps a
``fetch.Fetcher``: its transport becomes hishel's ``CacheTransport`` (non-RFC mode:
every successful GET is stored by URL in a SQLite file under the state directory and
served from there afterwards, whatever the response's caching headers). Only 2xx
responses are stored; redirects, 4xx and 5xx always go to the site.

A cache hit sends no request, so it must not take the site's gate. With the cache on,
``Runtime.take_gate`` hands out a ``DeferredGate``, registered for the calling thread;
the transport under the cache takes it only when a request is really about to be sent
(a miss). Hits and misses are counted per site in Redis (``cache_hits``,
``cache_misses`` in the site's stats), for ``crawler status`` and ``crawler stats``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import httpcore
import httpx

from .fetch import Fetcher, Response
from .guard import guarded_pool
from .pools import Transport

#: The cache's SQLite file, under the state directory.
CACHE_FILE = "http-cache.sqlite"


class DeferredGate:
    """A site's gate, taken only if a request is actually sent (``take``); otherwise never.

    Stands in for ``gate.Gate`` where the job uses it after the fetch: ``rearm``, ``let_go``.
    """

    def __init__(self, site: str, take: Callable[[], Any]):
        self.site = site
        self._take = take
        self.gate: Any = None

    def take(self) -> None:
        if self.gate is None:
            self.gate = self._take()

    def rearm(self) -> bool:
        return bool(self.gate.rearm()) if self.gate is not None else True

    def let_go(self) -> None:
        if self.gate is not None:
            self.gate.let_go()

    def lapsed(self) -> bool:
        """``Gate.lapsed`` of the gate once taken; False before: it is taken at the first byte, if one is sent."""
        return bool(self.gate.lapsed()) if self.gate is not None else False

    def before_send(self) -> None:
        """``Gate.before_send`` of the gate, taken now if it was not yet (a request is being written)."""
        self.take()
        self.gate.before_send()


class _Sending(httpx.BaseTransport):
    """The transport under the cache: reached on a miss only; takes the pending gate, then sends
    through the fetcher's guarded pool (httpcore's exceptions left for the fetcher to translate)."""

    def __init__(self, inner: Transport, local: threading.local):
        self.inner = inner
        self.local = local

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        pending: DeferredGate | None = getattr(self.local, "pending", None)
        if pending is not None:
            pending.take()
        self.local.sent = True
        url = request.url
        response = self.inner.handle_request(
            httpcore.Request(
                request.method,
                httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path),
                headers=request.headers.raw,
                content=request.read(),
                extensions=request.extensions,
            )
        )
        assert isinstance(response.stream, Iterable)
        return httpx.Response(
            response.status, headers=response.headers, stream=_Stream(response), extensions=response.extensions
        )

    def close(self) -> None:
        self.inner.close()


class _Stream(httpx.SyncByteStream):
    """An httpcore response's body, as httpx reads a stream."""

    def __init__(self, response: httpcore.Response):
        self._response = response

    def __iter__(self) -> Iterator[bytes]:
        yield from self._response.iter_stream()

    def close(self) -> None:
        self._response.close()


class _Cached:
    """The fetcher's transport with the cache on: its httpcore requests go through hishel's
    ``CacheTransport`` (an httpx one) and its answers come back as httpcore responses."""

    def __init__(self, cache: httpx.BaseTransport):
        self.cache = cache

    def handle_request(self, request: httpcore.Request) -> httpcore.Response:
        url = request.url
        response = self.cache.handle_request(
            httpx.Request(
                request.method.decode(),
                httpx.URL(scheme=url.scheme.decode(), host=url.host.decode(), port=url.port, raw_path=url.target),
                headers=request.headers,
                content=(b"".join(request.stream) or None) if isinstance(request.stream, Iterable) else None,
                extensions=request.extensions,
            )
        )
        assert isinstance(response.stream, httpx.SyncByteStream)
        return httpcore.Response(
            response.status_code, headers=response.headers.raw, content=response.stream, extensions=response.extensions
        )

    def close(self) -> None:
        self.cache.close()


class CachingFetcher:
    """A ``Fetcher`` whose GETs are stored on disk and replayed (see the module docstring).

    ``on_result(site, hit)`` is told about each fetch made under a ``DeferredGate``.
    """

    def __init__(self, fetcher: Fetcher, state_dir: str | Path, on_result: Callable[[str, bool], None] | None = None):
        from hishel import SqliteStorage
        from hishel.httpx import CacheTransport

        self.fetcher = fetcher
        self.path = Path(state_dir) / CACHE_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.on_result = on_result
        self._local = threading.local()
        old = fetcher.transport
        # Under the cache, the fetcher's own guarded pool: the deadline, the address check
        # and the gate's send check hold for every request that is really sent.
        sending = _Sending(guarded_pool(fetcher.ssl_context), self._local)
        storage = SqliteStorage(database_path=self.path)
        fetcher.transport = _Cached(CacheTransport(next_transport=sending, storage=storage))
        old.close()

    def defer(self, site: str, take: Callable[[], Any]) -> DeferredGate:
        """A gate for ``site`` that the next fetch in this thread takes only if it sends a request."""
        gate = DeferredGate(site, take)
        self._local.pending = gate
        return gate

    def get(
        self, url: str, user_agent: str | None = None, on_sent: Callable[[], Any] | None = None, **options: Any
    ) -> Response:
        """``Fetcher.get`` (same options), from the cache when the URL is stored (``extra["cache"]``: hit or miss)."""
        self._local.sent = False
        pending: DeferredGate | None = getattr(self._local, "pending", None)
        try:
            response = self.fetcher.get(url, user_agent=user_agent, on_sent=on_sent, **options)
        finally:
            self._local.pending = None
        hit = not self._local.sent
        response.extra["cache"] = "hit" if hit else "miss"
        if pending is not None and self.on_result is not None:
            self.on_result(pending.site, hit)
        return response

    def close(self) -> None:
        self.fetcher.close()

    def __getattr__(self, name: str) -> Any:  # timeout, max_body_bytes, transport: as the wrapped fetcher's
        return getattr(self.fetcher, name)
