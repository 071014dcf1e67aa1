"""HTTP: one GET with caps on body size, time and address, no redirects followed inline.

A ``Fetcher`` keeps its httpcore connection pools for the life of a worker process: one
per origin (``pools``), one per proxy. Redirects come back as responses (each hop is a
request of its own that passes the site's gate). httpcore's exceptions (and httpx's
``InvalidURL``: httpx parses the URLs) are translated into ``crawler.errors`` here, and
only here. The caps hold against a hostile server: the body's content-codings are undone a
bounded step at a time (``content``), so a stacked bomb never holds much more than the cap;
every socket operation, DNS included, gets only what is left of the request's deadline, and
the address connected to must be public unless the request allows private ones (``guard``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpcore
import httpx

from ..errors import (
    BadResponse,
    BodyTooLarge,
    ConnectError,
    FetchTimeout,
    ProxyError,
    RefusedURL,
    UnsupportedScheme,
)
from ..settings import redact_url, scrub, url_secrets
from .content import ACCEPTED_ENCODINGS, ContentDecoder, DecodeError
from .guard import RequestGuard, guarded_pool
from .headers import charset_of, decode_headers, encode_headers, first_header, join_headers, parse_retry_after
from .pools import OriginPools, Transport

HTML_TYPES = ("text/html", "application/xhtml+xml")


@dataclass
class Response:
    """A response as received: status, headers, body (decoded from its content-coding)."""

    url: str
    status: int
    headers: dict[str, str]
    body: bytes
    started: datetime
    elapsed: float
    encoding: str | None = None
    extra: dict[str, str] = field(default_factory=dict)
    #: The body was cut at ``truncate_at`` (more was sent).
    truncated: bool = False
    #: Decoded bytes handed to the request's ``sink`` instead of ``body``.
    sunk: int = 0
    #: The raw ``Set-Cookie`` values, one per header, one character a byte received (Latin-1), for
    #: the site's cookie jar (``session``), which sends them back as received; never in ``headers``,
    #: which are shown and handed on: cookie values are secrets.
    set_cookies: list[str] = field(default_factory=list, repr=False)

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip().lower()

    @property
    def is_html(self) -> bool:
        """Whether the body is HTML (a missing content type counts as HTML)."""
        return self.content_type in HTML_TYPES or self.content_type == ""

    @property
    def location(self) -> str | None:
        return self.headers.get("location")

    def retry_after(self, now: float | None = None) -> float | None:
        """Seconds the server asked to wait (``Retry-After``: seconds or an HTTP date)."""
        return parse_retry_after(self.headers.get("retry-after"), now)


class Fetcher:
    """Downloads URLs through pooled httpcore connections, within body, time and address caps.

    Requests go to httpcore's pools directly, not through httpx's client nor its transport:
    the client's redirect, auth and cookie handling have no use here (redirects are requests
    of their own, through the gate), and httpx's request, response and stream objects around
    httpcore's would cost CPU on every request. httpx still parses each URL (``httpx.URL``:
    IDNA, IPv6, percent-encoding, as everywhere else in the crawler). No cookie is kept here:
    a site's jar is shared by the fleet in Redis (``session.Jar``), its ``Cookie`` header
    passed in ``headers`` and the response's ``Set-Cookie`` given back in
    ``Response.set_cookies``, so a crawl's requests do not depend on which worker process made
    the earlier ones.
    """

    def __init__(self, timeout: float, max_body_bytes: int, user_agent: str):
        self.timeout = timeout
        self.max_body_bytes = max_body_bytes
        self.user_agent = user_agent
        #: Sent with every request (a request's own headers win), names in lower case.
        self.headers = {
            "user-agent": user_agent,
            "accept": "text/html,application/xhtml+xml,*/*;q=0.8",
            "accept-encoding": ACCEPTED_ENCODINGS,
        }
        self._raw_headers = encode_headers(self.headers)
        self._timeouts = httpx.Timeout(timeout).as_dict()
        #: Shared by every pool: loading the CA certificates for each would cost time and memory.
        self.ssl_context = httpx.create_ssl_context()
        #: Where direct requests go: one pool per origin (``pools``); the cache puts itself here.
        self.transport: Transport = OriginPools(lambda: guarded_pool(self.ssl_context))
        #: One pool per proxy URL, made on first use.
        self._proxied: dict[str, Transport] = {}
        self._lock = threading.Lock()

    def _transport(self, proxy: str | None) -> Transport:
        if proxy is None:
            return self.transport
        with self._lock:
            transport = self._proxied.get(proxy)
            if transport is None:
                transport = self._proxied[proxy] = guarded_pool(self.ssl_context, proxy)
            return transport

    def get(
        self,
        url: str,
        user_agent: str | None = None,
        on_sent: Callable[[], Any] | None = None,
        *,
        allow_private: bool = False,
        truncate_at: int | None = None,
        before_send: Callable[[], Any] | None = None,
        headers: Mapping[str, str] | None = None,
        max_bytes: int | None = None,
        sink: Callable[[bytes], Any] | None = None,
        proxy: str | None = None,
        method: str = "GET",
        body: bytes | None = None,
        timeout: float | None = None,
    ) -> Response:
        """GET ``url`` (or send it ``method`` with ``body``) within ``timeout`` seconds for the whole
        request (the fetcher's, or the one given if shorter: what is left of a render), and the body cap.

        Raises TransientError (timeout, connection) or PermanentError: BodyTooLarge,
        BadResponse (malformed or oversized headers, undecodable body, unknown
        content-coding), UnsupportedScheme (not http/https), RefusedURL (malformed URL, or a
        header that cannot be sent), PrivateAddress (the address connected to is not public,
        and neither ``allow_private`` nor an IP-literal or ``localhost`` host allows it).

        ``before_send()`` is called right before the first byte of the request is written
        to the socket, after any connection set-up (the gate is checked there: see
        ``Gate.before_send``); ``on_sent()`` once the request has been written, before
        the response is read (the gate is rearmed there). ``truncate_at`` reads at
        most that many decoded bytes and returns them (``Response.truncated`` set)
        instead of failing on the cap. ``headers`` are sent as well (a refresh's
        ``If-None-Match``). ``max_bytes`` replaces the body cap for this request (a
        sitemap's is larger). ``sink(piece)`` gets the decoded body piece by piece instead
        of the response (whose ``body`` is then empty and ``sunk`` says how much went), so
        a large body is never held whole. ``proxy`` (a URL, credentials allowed) sends the
        request through that proxy; a proxy that cannot be reached or refuses the request
        raises ProxyError, whose message shows the proxy without its credentials.
        A ``user-agent`` among ``headers`` wins over ``user_agent``.
        """
        started, clock = datetime.now(UTC), time.monotonic()
        request = self._request(method, url, user_agent, headers, body)
        limit = self.timeout if timeout is None else max(0.0, min(timeout, self.timeout))
        # Through a proxy, the address connected to is the proxy's: the check applies to it.
        guard = RequestGuard(clock + limit, allow_private, proxy or url, before_send, on_sent)
        transport = self._transport(proxy)
        try:
            return self._exchange(transport, request, guard, url, started, clock, truncate_at, max_bytes, sink)
        except _HTTPCORE_ERRORS as exc:
            raise _translated(exc, url, proxy, time.monotonic() - clock, limit) from exc

    def _exchange(
        self,
        transport: Transport,
        request: httpcore.Request,
        guard: RequestGuard,
        url: str,
        started: datetime,
        clock: float,
        truncate_at: int | None,
        max_bytes: int | None,
        sink: Callable[[bytes], Any] | None,
    ) -> Response:
        """``request`` sent through ``transport`` under ``guard``, and its response read (httpcore's
        exceptions raised as they come)."""
        with guard.active():
            response = transport.handle_request(request)
            try:
                raw_headers = decode_headers(response.headers)
                content, truncated, sunk = self._read_body(
                    response, raw_headers, guard.deadline, truncate_at, max_bytes, sink
                )
            finally:
                response.close()
        content_type = first_header(raw_headers, "content-type")
        return Response(
            url=url,
            status=response.status,
            headers=join_headers(raw_headers),
            body=content,
            started=started,
            elapsed=time.monotonic() - clock,
            encoding=charset_of(content_type),
            truncated=truncated,
            sunk=sunk,
            set_cookies=[value.decode("latin-1") for name, value in response.headers if name.lower() == b"set-cookie"],
        )

    def _request(
        self,
        method: str,
        url: str,
        user_agent: str | None,
        headers: Mapping[str, str] | None,
        body: bytes | None,
    ) -> httpcore.Request:
        """``_build_request``, its errors as the crawler's: RefusedURL for a malformed URL or a header
        that cannot be sent, UnsupportedScheme for a URL not http(s)."""
        try:
            return self._build_request(method, url, user_agent, headers, body)
        except httpx.InvalidURL as exc:
            raise RefusedURL(f"malformed URL: {exc}") from exc
        except (UnicodeEncodeError, AttributeError) as exc:
            raise RefusedURL(f"request cannot be sent: a header is not an ASCII string ({exc})") from exc

    def _build_request(
        self,
        method: str,
        url: str,
        user_agent: str | None,
        headers: Mapping[str, str] | None,
        body: bytes | None,
    ) -> httpcore.Request:
        """The request as httpcore sends it, with the headers httpx would add (Host, Content-Length).

        Raises httpx.InvalidURL for a malformed URL, UnsupportedScheme for one not http(s),
        UnicodeEncodeError or AttributeError for a header that is not an ASCII string.
        """
        target = httpx.URL(url)
        if target.scheme not in ("http", "https"):
            raise UnsupportedScheme(f"not an http(s) URL: {url}")
        if not target.raw_host:
            raise httpx.InvalidURL("no host")
        raw, own_host = self._raw_headers, False
        if headers or user_agent:
            merged = dict(self.headers)
            if user_agent:
                merged["user-agent"] = user_agent
            merged.update({name.lower(): value for name, value in (headers or {}).items()})
            raw, own_host = encode_headers(merged), "host" in merged
        preset = [] if own_host else [(b"host", target.netloc)]
        if body is not None:
            preset.append((b"content-length", str(len(body)).encode()))
        elif method in ("POST", "PUT", "PATCH"):
            preset.append((b"content-length", b"0"))
        return httpcore.Request(
            method,
            httpcore.URL(scheme=target.raw_scheme, host=target.raw_host, port=target.port, target=target.raw_path),
            headers=preset + raw,
            content=body,
            extensions={"timeout": self._timeouts},
        )

    def _read_body(
        self,
        response: httpcore.Response,
        headers: list[tuple[str, str]],
        deadline: float,
        truncate_at: int | None,
        max_bytes: int | None = None,
        sink: Callable[[bytes], Any] | None = None,
    ) -> tuple[bytes, bool, int]:
        """The decoded body of ``response`` (whose ``headers`` are given decoded), whether it was
        truncated, and how many bytes went to ``sink`` instead.

        Raises BodyTooLarge past the cap (``max_bytes``, else the fetcher's).
        """
        limit = (max_bytes or self.max_body_bytes) if truncate_at is None else truncate_at
        declared = first_header(headers, "content-length") or ""
        if truncate_at is None and declared.isdigit() and int(declared) > limit:
            raise BodyTooLarge(f"Content-Length {declared} exceeds the cap of {limit} bytes")
        pieces: list[bytes] = []
        size = received = 0
        try:
            decoder = ContentDecoder(", ".join(value for name, value in headers if name == "content-encoding"))
            for raw in response.iter_stream():
                received += len(raw)
                for piece in decoder.feed(raw):
                    if size + len(piece) > limit:
                        if truncate_at is None:
                            raise BodyTooLarge(f"body exceeds the cap of {limit} bytes (decoded)")
                        pieces.append(piece[: limit - size])
                        return b"".join(pieces), True, 0
                    if sink is not None:
                        sink(piece)
                    else:
                        pieces.append(piece)
                    size += len(piece)
                if received > limit:  # what went over the wire counts too (a stream that inflates to nothing)
                    if truncate_at is None:
                        raise BodyTooLarge(f"body exceeds the cap of {limit} bytes (on the wire)")
                    return b"".join(pieces), True, 0
                if time.monotonic() > deadline:
                    raise FetchTimeout(f"body took longer than {self.timeout:g}s")
        except DecodeError as exc:
            raise BadResponse(f"undecodable body: {exc}") from exc
        return b"".join(pieces), False, size if sink is not None else 0

    def close(self) -> None:
        self.transport.close()
        for transport in self._proxied.values():
            transport.close()


#: httpcore's exceptions a request may raise, translated into the crawler's by ``_translated``.
_HTTPCORE_ERRORS = (
    httpcore.ProxyError,
    httpcore.TimeoutException,
    httpcore.UnsupportedProtocol,
    httpcore.LocalProtocolError,
    httpcore.RemoteProtocolError,
    httpcore.NetworkError,
)


def _translated(exc: Exception, url: str, proxy: str | None, took: float, limit: float) -> Exception:
    """``exc``, one of ``_HTTPCORE_ERRORS`` raised by a request to ``url`` after ``took`` seconds of
    ``limit``, as the crawler's exception: a failing proxy's is ProxyError, whatever its kind."""
    if isinstance(exc, httpcore.ProxyError) or (proxy is not None and _proxy_failed(exc)):
        return _proxy_error(proxy, exc)
    if isinstance(exc, httpcore.TimeoutException):
        return FetchTimeout(
            f"timed out after {took:.1f}s (limit {limit:g}s for the whole request): {type(exc).__name__}"
        )
    if isinstance(exc, httpcore.UnsupportedProtocol):
        return UnsupportedScheme(f"not an http(s) URL: {url}")
    if isinstance(exc, httpcore.LocalProtocolError):
        return RefusedURL(f"request cannot be sent: {exc}")
    if isinstance(exc, httpcore.RemoteProtocolError) and not _is_disconnect(exc):
        return BadResponse(f"malformed response: {exc}")
    return ConnectError(f"{type(exc).__name__}: {exc}")  # a network error, or the peer hanging up


def _proxy_error(proxy: str | None, exc: Exception) -> ProxyError:
    """ProxyError for ``exc``, the proxy shown without its credentials, in the message too."""
    reason = scrub(f"{type(exc).__name__}: {exc}", url_secrets(proxy or ""))
    return ProxyError(f"proxy {redact_url(proxy or '')} failed: {reason}")


def _proxy_failed(exc: Exception) -> bool:
    """Whether a proxied request's error says the proxy itself failed: not reached, the connection
    reset or dropped (a CONNECT answered non-2xx, 407, is httpcore's ProxyError, caught before).

    The connection is to the proxy, which reports the target's failures as statuses (502,
    504); a read timeout is left out, as it may be a slow target behind a working proxy.
    """
    if isinstance(exc, httpcore.NetworkError | httpcore.ConnectTimeout):
        return True
    return isinstance(exc, httpcore.RemoteProtocolError) and _is_disconnect(exc)


def _is_disconnect(exc: httpcore.RemoteProtocolError) -> bool:
    """Whether a protocol error is the peer hanging up (worth retrying), not a malformed answer."""
    text = str(exc).lower()
    return "disconnected" in text or "closed" in text
