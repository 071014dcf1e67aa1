"""Guarded connections: each socket operation within its request's deadline, the peer checked, the send hooks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx

from ..errors import PrivateAddress
from .addresses import ResolveTimeout, is_public_address, names_its_address, resolve_within
from .pools import IDLE_FOR

#: Idle connections kept open to one origin (``pools.OriginPools``: one pool per origin). The
#: number in use is not capped here: it is the worker threads' number, one request each.
KEEP_ALIVE = 20
#: Seconds a name is waited for when a connection has no deadline (the fetcher's always have one).
DEFAULT_RESOLVE_WAIT = 30.0

_local = threading.local()


class RequestGuard:
    """What the calling thread's request may do (until when; whether to private addresses), and
    what to call around its send (``before_send`` before its first byte, ``on_sent`` once written).
    Its ``before_send`` is the gate's check (``Gate.before_send``, the send grace), not a spider's
    ``before_send`` hook: that one runs earlier, before the request is built (``gated_fetch.prepared``).

    Every socket operation, DNS included, gets only what is left before ``deadline``, so a server
    dripping its headers cannot hold a worker past it, on a new connection or a pooled one.
    Private addresses are allowed by ``allow_private``, or by ``url`` naming its host as an
    IP address or ``localhost`` (looked at only when a connection is made, before a byte is
    sent: a pooled one was checked when it was), so a name resolving to a private address
    (DNS rebinding) is refused.
    """

    def __init__(
        self,
        deadline: float,
        allow_private: bool,
        url: str = "",
        before_send: Callable[[], Any] | None = None,
        on_sent: Callable[[], Any] | None = None,
    ):
        self.deadline = deadline
        self.allow_private = allow_private
        self.url = url
        self.before_send = before_send
        self.on_sent = on_sent
        #: The request's first byte has been written (a tunnel's CONNECT is not the request).
        self.writing = False

    @contextmanager
    def active(self) -> Iterator[RequestGuard]:
        """While in this block, the guard applies to the connections this thread uses."""
        previous = getattr(_local, "guard", None)
        _local.guard = self
        try:
            yield self
        finally:
            _local.guard = previous

    def time_left(self, timeout: float | None, expired: type[Exception]) -> float | None:
        """``timeout`` shortened to what is left before the deadline; ``expired`` once it is past."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise expired("the request's deadline has passed")
        return left if timeout is None else min(timeout, left)

    def check_peer(self, stream: httpcore.NetworkStream, host: str) -> None:
        """Refuse a connection to a non-public address unless this request allows it."""
        if self.allow_private or names_its_address(self.url):
            return
        sock = stream.get_extra_info("socket")
        address = str(sock.getpeername()[0]) if sock is not None else None
        if address is not None and not is_public_address(address):
            raise PrivateAddress(
                f"{host} resolves to {address}, which is not a public address "
                "(set allow_private_addresses on the spider to allow it)"
            )


def _time_left(timeout: float | None, expired: type[Exception]) -> float | None:
    guard: RequestGuard | None = getattr(_local, "guard", None)
    return timeout if guard is None else guard.time_left(timeout, expired)


class GuardedStream(httpcore.NetworkStream):
    """A network stream whose every operation ends by the current request's deadline.

    The sync client runs a request's I/O in the calling thread, so the guard in force is
    that thread's, also when the connection came from the pool.
    """

    def __init__(self, stream: httpcore.NetworkStream):
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        guard: RequestGuard | None = getattr(_local, "guard", None)
        if guard is not None and guard.writing and guard.on_sent is not None:
            # The first read after the request was written: it is on the wire (the gate is rearmed here).
            on_sent, guard.on_sent = guard.on_sent, None
            on_sent()
        return self._stream.read(max_bytes, _time_left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        guard: RequestGuard | None = getattr(_local, "guard", None)
        if guard is not None and not guard.writing and buffer and not buffer.startswith(b"CONNECT "):
            # The request's first write, as close to the socket as the stack allows (the gate's check);
            # not a tunnel's CONNECT to a proxy (nor the empty write ending it), which come before the request.
            guard.writing = True
            if guard.before_send is not None:
                before_send, guard.before_send = guard.before_send, None
                before_send()
        self._stream.write(buffer, _time_left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        stream = self._stream.start_tls(ssl_context, server_hostname, _time_left(timeout, httpcore.ConnectTimeout))
        return GuardedStream(stream)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class GuardedBackend(httpcore.NetworkBackend):
    """httpcore's sync backend, with the deadline on every stream and the peer address checked."""

    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        stream = self._connect(host, port, timeout, local_address, socket_options)
        guard: RequestGuard | None = getattr(_local, "guard", None)
        try:
            if guard is not None:
                guard.check_peer(stream, host)  # before a byte of the request is written
        except BaseException:
            stream.close()
            raise
        return GuardedStream(stream)

    def _connect(
        self, host: str, port: int, timeout: float | None, local_address: str | None, socket_options: Any
    ) -> httpcore.NetworkStream:
        """A connection to ``host``: its name resolved within the deadline (``addresses.resolve_within``),
        then each address tried in turn, as ``socket.create_connection`` does.

        The connection is to an address, but TLS (SNI, the certificate) and the Host header
        still use the name: httpcore takes them from the URL, not from here.
        """
        wait = _time_left(timeout, httpcore.ConnectTimeout)
        try:
            infos = resolve_within(host.strip("[]"), port, DEFAULT_RESOLVE_WAIT if wait is None else wait)
        except ResolveTimeout as exc:
            raise httpcore.ConnectTimeout(str(exc)) from exc
        except (OSError, UnicodeError) as exc:
            raise httpcore.ConnectError(f"{host}: {exc}") from exc
        failure: Exception = httpcore.ConnectError(f"{host} resolves to no address")
        for address in dict.fromkeys(str(info[4][0]) for info in infos):
            try:
                return self._backend.connect_tcp(
                    address, port, _time_left(timeout, httpcore.ConnectTimeout), local_address, socket_options
                )
            except httpcore.ConnectTimeout:
                raise  # the deadline is spent: no time for the next address
            except httpcore.ConnectError as exc:
                failure = exc
        raise failure

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        return GuardedStream(
            self._backend.connect_unix_socket(path, _time_left(timeout, httpcore.ConnectTimeout), socket_options)
        )

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def guarded_pool(
    ssl_context: Any, proxy: str | None = None, keep_alive: int | None = None
) -> httpcore.ConnectionPool | httpcore.HTTPProxy:
    """An httpcore pool over ``GuardedBackend``, direct or through ``proxy``, as httpx's transport
    builds its own (HTTP/1.1, verified TLS with ``ssl_context``), keeping ``keep_alive`` idle
    connections (``KEEP_ALIVE`` by default) for ``pools.IDLE_FOR`` seconds; no cap on those in use.

    Through a proxy, the connection is to the proxy, which resolves the target itself: the address
    check applies to the proxy's address, and the send hooks skip a tunnel's ``CONNECT``."""
    options: dict[str, Any] = {
        "ssl_context": ssl_context,
        "max_connections": None,
        "max_keepalive_connections": KEEP_ALIVE if keep_alive is None else keep_alive,
        "keepalive_expiry": IDLE_FOR,
        "network_backend": GuardedBackend(),
    }
    if proxy is None:
        return httpcore.ConnectionPool(**options)
    # As httpx's transport builds its proxy pool: http targets are forwarded (absolute-form
    # request lines), https ones tunnelled (CONNECT); credentials go in Proxy-Authorization.
    spec = httpx.Proxy(proxy)
    return httpcore.HTTPProxy(
        proxy_url=httpcore.URL(
            scheme=spec.url.raw_scheme, host=spec.url.raw_host, port=spec.url.port, target=spec.url.raw_path
        ),
        proxy_auth=spec.raw_auth,
        proxy_headers=spec.headers.raw,
        **options,
    )
