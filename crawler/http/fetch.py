"""HTTP: one GET with caps on body size, time and address, no redirects followed inline.

A ``Fetcher`` keeps its httpcore connection pools for the life of a worker process: one
per origin (``pools``), one per proxy. Redirects come back as responses (each hop is a
request of its own that passes the site's gate). httpcore's exceptions (and httpx's
``InvalidURL``: httpx parses the URLs) are translated into ``crawler.errors`` here, and
only here.

What a hostile server can do is bounded three ways:

- **Size.** The body is read raw and its content-codings (``gzip``, ``deflate`` zlib-wrapped
  or raw, ``br`` when a bounded ``brotli`` is installed, ``identity``) are undone here,
  each stage handing on at most ``DECODE_STEP`` bytes at a time, so a stacked bomb
  (``gzip, gzip``) never holds much more than the cap, whatever it would inflate to.
- **Time.** ``timeout`` bounds the whole request (DNS, connect, TLS, headers, body) as
  one deadline: every socket operation gets only what is left of it, so a server dripping
  its headers a byte at a time cannot hold a worker past it, on a new connection or a
  pooled one. The host name is resolved here, in a lookup thread waited for within the
  deadline (``addresses.resolve_within``: ``getaddrinfo`` takes no timeout, so a name
  server that never answers would otherwise hold the worker), and the connection is
  made to the address found, the name still given to TLS and in the Host header.
- **Address.** The address actually connected to (after DNS) must be public, unless the
  request allows private ones (the spider opts in, or the URL names an IP address or
  ``localhost`` outright); checked on each new connection before a byte is sent, so a
  name that resolves to a private address (DNS rebinding) is refused. Through a proxy,
  the connection is to the proxy, which resolves the target itself: the check then
  applies to the proxy's address only (a proxy named by IP address or ``localhost``
  passes), and the target's address is the proxy's business.

A request may go through a proxy (``proxy=``): the fetcher keeps one pool per proxy
(httpcore's ``HTTPProxy``), over the same guarded network backend, so a proxied request
keeps the deadline, the address check and the ``before_send`` and ``on_sent`` hooks (for
an https target, they skip the tunnel's ``CONNECT`` and fire for the request itself).
"""

from __future__ import annotations

import email.message
import email.utils
import functools
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import httpcore
import httpx

from ..errors import (
    BadResponse,
    BodyTooLarge,
    ConnectError,
    FetchTimeout,
    PrivateAddress,
    ProxyError,
    RefusedURL,
    UnsupportedScheme,
)
from ..settings import redact_url, scrub, url_secrets
from .addresses import ResolveTimeout, is_public_address, names_its_address, resolve_within
from .pools import IDLE_FOR, OriginPools, Transport

try:  # brotli ≥ 1.2 can bound its output; an older one cannot, so br is then not accepted
    import brotli

    _BROTLI = hasattr(brotli.Decompressor, "can_accept_more_data")
except ImportError:  # pragma: no cover - depends on what is installed
    _BROTLI = False

HTML_TYPES = ("text/html", "application/xhtml+xml")

#: Most bytes one decoding stage hands on at a time (bounds memory above the cap).
DECODE_STEP = 256 * 1024

#: The content-codings this module decodes, as sent in Accept-Encoding.
ACCEPTED_ENCODINGS = "gzip, deflate, br" if _BROTLI else "gzip, deflate"

#: Seconds a name is waited for when a connection has no deadline (the fetcher's always have one).
DEFAULT_RESOLVE_WAIT = 30.0

#: wbits for a gzip-wrapped deflate stream.
_GZIP_WBITS = 16 + zlib.MAX_WBITS


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


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` in seconds from now, or None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


#: Idle connections kept open to one origin (``pools.OriginPools``: one pool per origin). The
#: number in use is not capped here: it is the worker threads' number, one request each.
KEEP_ALIVE = 20


class Fetcher:
    """Downloads URLs through pooled httpcore connections, within body, time and address caps.

    Requests go to httpcore's pools directly, not through httpx's client nor its transport:
    the client's redirect, auth and cookie handling have no use here (redirects are requests
    of their own, through the gate), and httpx's request, response and stream objects around
    httpcore's cost some 0.15 ms of CPU a request, 5 % of a crawl of slow sites. httpx
    still parses each URL (``httpx.URL``: IDNA, IPv6, percent-encoding, as everywhere else in
    the crawler). No cookie is kept here: a site's jar is shared by the fleet in Redis
    (``session.Jar``), its ``Cookie`` header passed in ``headers`` and the response's
    ``Set-Cookie`` given back in ``Response.set_cookies``, so a crawl's requests do not depend
    on which worker process made the earlier ones.
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
        #: Shared by every pool: loading the CA certificates costs milliseconds and some hundreds of KiB each time.
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
        started = datetime.now(UTC)
        clock = time.monotonic()
        try:
            request = self._request(method, url, user_agent, headers, body)
        except httpx.InvalidURL as exc:
            raise RefusedURL(f"malformed URL: {exc}") from exc
        except (UnicodeEncodeError, AttributeError) as exc:
            raise RefusedURL(f"request cannot be sent: a header is not an ASCII string ({exc})") from exc
        # Through a proxy, the address connected to is the proxy's: the check applies to it.
        limit = self.timeout if timeout is None else max(0.0, min(timeout, self.timeout))
        guard = _RequestGuard(clock + limit, allow_private, proxy or url, before_send, on_sent)
        transport = self._transport(proxy)
        try:
            try:
                with guard.active():
                    response = transport.handle_request(request)
                    try:
                        raw_headers = _decode_headers(response.headers)
                        content, truncated, sunk = self._read_body(
                            response, raw_headers, guard.deadline, truncate_at, max_bytes, sink
                        )
                    finally:
                        response.close()
            except httpcore.ProxyError as exc:
                raise self._proxy_error(proxy, exc) from exc
            except (httpcore.NetworkError, httpcore.TimeoutException, httpcore.RemoteProtocolError) as exc:
                if proxy is not None and _proxy_failed(exc):
                    raise self._proxy_error(proxy, exc) from exc
                raise
        except httpcore.TimeoutException as exc:
            raise FetchTimeout(
                f"timed out after {time.monotonic() - clock:.1f}s "
                f"(limit {limit:g}s for the whole request): {type(exc).__name__}"
            ) from exc
        except httpcore.UnsupportedProtocol as exc:
            raise UnsupportedScheme(f"not an http(s) URL: {url}") from exc
        except httpcore.LocalProtocolError as exc:
            raise RefusedURL(f"request cannot be sent: {exc}") from exc
        except httpcore.RemoteProtocolError as exc:
            if _is_disconnect(exc):
                raise ConnectError(f"{type(exc).__name__}: {exc}") from exc
            raise BadResponse(f"malformed response: {exc}") from exc
        except httpcore.NetworkError as exc:
            raise ConnectError(f"{type(exc).__name__}: {exc}") from exc
        content_type = _first(raw_headers, "content-type")
        return Response(
            url=url,
            status=response.status,
            headers=_joined(raw_headers),
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

    @staticmethod
    def _proxy_error(proxy: str | None, exc: Exception) -> ProxyError:
        reason = scrub(f"{type(exc).__name__}: {exc}", url_secrets(proxy or ""))
        return ProxyError(f"proxy {redact_url(proxy or '')} failed: {reason}")

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
        declared = _first(headers, "content-length") or ""
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


def encode_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """``headers`` as sent: ASCII only, as httpx sends them (UnicodeEncodeError otherwise; AttributeError
    for a name or value that is not a string), but for ``Cookie``, one character a byte (Latin-1): the
    jar sends cookies back as the bytes received (``Response.set_cookies``)."""
    return [
        (name.encode("ascii"), value.encode("latin-1" if name.lower() == "cookie" else "ascii"))
        for name, value in headers.items()
    ]


def _decode_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """A response's headers as text, names in lower case, decoded as httpx decodes them: ASCII,
    else UTF-8, else Latin-1, whichever reads every one of them."""
    for encoding in ("ascii", "utf-8"):
        try:
            return [(name.decode(encoding).lower(), value.decode(encoding)) for name, value in raw]
        except UnicodeDecodeError:
            continue
    return [(name.decode("latin-1").lower(), value.decode("latin-1")) for name, value in raw]


def _first(headers: list[tuple[str, str]], name: str) -> str | None:
    return next((value for key, value in headers if key == name), None)


def _joined(headers: list[tuple[str, str]]) -> dict[str, str]:
    """One value a name, a repeated header's values joined with ``", "`` (as httpx's ``Headers.items``);
    no ``Set-Cookie``: cookie values are secrets, kept apart (``Response.set_cookies``)."""
    joined: dict[str, str] = {}
    for name, value in headers:
        if name != "set-cookie":
            joined[name] = f"{joined[name]}, {value}" if name in joined else value
    return joined


def charset_of(content_type: str | None) -> str | None:
    """The charset ``content_type`` names, read as httpx reads it (``Response.charset_encoding``)."""
    return None if content_type is None else _charset_of(content_type)


@functools.lru_cache(maxsize=256)
def _charset_of(content_type: str) -> str | None:
    # Cached: a site sends the same few values, and the email parser took 2-3 % of a download
    # process's CPU at 200 slow sites. Bounded: a server sending a new value each time only evicts.
    message = email.message.Message()
    message["content-type"] = content_type
    return message.get_content_charset(failobj=None)


def merge_headers(under: Mapping[str, str], over: Mapping[str, str]) -> dict[str, str]:
    """``under`` with ``over`` on top, header names compared without case."""
    if not under:
        return dict(over)
    overridden = {name.lower() for name in over}
    return {**{k: v for k, v in under.items() if k.lower() not in overridden}, **over}


def user_agent_of(headers: Mapping[str, str], default: str) -> str:
    """The User-Agent ``headers`` name (any case), else ``default``: what robots.txt is read for."""
    return next((v for k, v in headers.items() if k.lower() == "user-agent"), default)


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


# -- content-codings ------------------------------------------------------------------------


class DecodeError(Exception):
    """The body is not what its Content-Encoding says, or the coding is unknown."""


class _Stage(Protocol):
    def feed(self, data: bytes) -> Iterator[bytes]:
        """Decoded output of ``data``, in pieces of at most about ``DECODE_STEP`` bytes."""
        ...


class ContentDecoder:
    """Undoes a Content-Encoding chain (``gzip, gzip``, …) as the body streams in.

    Each stage is pulled lazily by the next, so each holds at most one piece of about
    ``DECODE_STEP`` bytes; the reader can stop at its cap after at most one more step
    than the cap. Raises DecodeError for an unknown coding or a corrupt body.
    """

    def __init__(self, header: str):
        codings = [coding.strip().lower() for coding in header.split(",") if coding.strip()]
        # Codings are listed in the order they were applied: undo the last one first.
        self._stages = [_stage_for(coding) for coding in reversed(codings) if coding != "identity"]

    def feed(self, data: bytes) -> Iterator[bytes]:
        """Decoded pieces of the next raw bytes of the body."""
        return self._through(0, data)

    def _through(self, index: int, data: bytes) -> Iterator[bytes]:
        if index == len(self._stages):
            if data:
                yield data
            return
        for piece in self._stages[index].feed(data):
            yield from self._through(index + 1, piece)


def _stage_for(coding: str) -> _Stage:
    if coding in ("gzip", "x-gzip", "deflate"):
        return _ZlibStage(coding)
    if coding == "br" and _BROTLI:
        return _BrotliStage()
    raise DecodeError(f"unsupported content-coding {coding!r}")


class _ZlibStage:
    """gzip (every member), or deflate zlib-wrapped or raw, inflated a bounded step at a time."""

    def __init__(self, coding: str):
        self._gzip = coding != "deflate"
        self._inflater = zlib.decompressobj(_GZIP_WBITS) if self._gzip else None
        self._head = b""  # deflate: the first bytes, until they tell zlib-wrapped from raw
        self._ended = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        if self._ended:
            return
        if self._inflater is None:
            self._head += data
            if len(self._head) < 2:
                return
            data, self._head = self._head, b""
            self._inflater = zlib.decompressobj(zlib.MAX_WBITS if _is_zlib_header(data) else -zlib.MAX_WBITS)
        while True:
            if self._inflater.eof:
                if not data:
                    return
                if not (self._gzip and data.startswith(b"\x1f")):
                    self._ended = True  # bytes after the end of the stream are ignored, as browsers do
                    return
                self._inflater = zlib.decompressobj(_GZIP_WBITS)  # another gzip member follows
            try:
                out = self._inflater.decompress(data, DECODE_STEP)
            except zlib.error as exc:
                raise DecodeError(str(exc)) from exc
            data = self._inflater.unconsumed_tail or self._inflater.unused_data
            if out:
                yield out
            # A full step may leave output inside zlib: go round again, with no new input if need be.
            if not data and len(out) < DECODE_STEP:
                return


def _is_zlib_header(data: bytes) -> bool:
    """Whether ``data`` starts with a zlib header (RFC 1950): deflate method, check bits right."""
    return data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


class _BrotliStage:
    """br, decompressed a bounded step at a time (brotli ≥ 1.2)."""

    def __init__(self) -> None:
        self._decompressor = brotli.Decompressor()

    def feed(self, data: bytes) -> Iterator[bytes]:
        try:
            while not self._decompressor.can_accept_more_data():  # output left from the last feed
                yield self._decompressor.process(b"", output_buffer_limit=DECODE_STEP)
            out = self._decompressor.process(data, output_buffer_limit=DECODE_STEP)
            while out:
                yield out
                if self._decompressor.is_finished():
                    return
                out = self._decompressor.process(b"", output_buffer_limit=DECODE_STEP)
        except brotli.error as exc:
            raise DecodeError(f"brotli: {exc}") from exc


def inflate_capped(data: bytes, cap: int) -> bytes:
    """``zlib.decompress(data)``, but raises BodyTooLarge as soon as the output passes ``cap``
    bytes (never inflating more than ``cap + 1``), and zlib.error for a corrupt or
    truncated stream."""
    inflater = zlib.decompressobj()
    out = inflater.decompress(data, cap + 1)
    if len(out) > cap:
        raise BodyTooLarge(f"compressed body inflates past the cap of {cap} bytes")
    if not inflater.eof:
        raise zlib.error("incomplete or truncated zlib stream")
    return out


# -- the guarded connection: one deadline per request, the peer address checked --------------


_local = threading.local()


class _RequestGuard:
    """What the calling thread's request may do (until when; whether to private addresses), and
    what to call around its send (``before_send`` before its first byte, ``on_sent`` once written).

    Private addresses are allowed by ``allow_private``, or by ``url`` naming its host as an
    IP address or ``localhost`` (looked at only when a connection is made: a pooled one was
    checked when it was).
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
    def active(self) -> Iterator[_RequestGuard]:
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
    guard: _RequestGuard | None = getattr(_local, "guard", None)
    return timeout if guard is None else guard.time_left(timeout, expired)


class _GuardedStream(httpcore.NetworkStream):
    """A network stream whose every operation ends by the current request's deadline.

    The sync client runs a request's I/O in the calling thread, so the guard in force is
    that thread's, also when the connection came from the pool.
    """

    def __init__(self, stream: httpcore.NetworkStream):
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        guard: _RequestGuard | None = getattr(_local, "guard", None)
        if guard is not None and guard.writing and guard.on_sent is not None:
            # The first read after the request was written: it is on the wire (the gate is rearmed here).
            on_sent, guard.on_sent = guard.on_sent, None
            on_sent()
        return self._stream.read(max_bytes, _time_left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        guard: _RequestGuard | None = getattr(_local, "guard", None)
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
        return _GuardedStream(stream)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _GuardedBackend(httpcore.NetworkBackend):
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
        guard: _RequestGuard | None = getattr(_local, "guard", None)
        try:
            if guard is not None:
                guard.check_peer(stream, host)  # before a byte of the request is written
        except BaseException:
            stream.close()
            raise
        return _GuardedStream(stream)

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
        return _GuardedStream(
            self._backend.connect_unix_socket(path, _time_left(timeout, httpcore.ConnectTimeout), socket_options)
        )

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def guarded_pool(
    ssl_context: Any, proxy: str | None = None, keep_alive: int | None = None
) -> httpcore.ConnectionPool | httpcore.HTTPProxy:
    """An httpcore pool over ``_GuardedBackend``, direct or through ``proxy``, as httpx's transport
    builds its own (HTTP/1.1, verified TLS with ``ssl_context``), keeping ``keep_alive`` idle
    connections (``KEEP_ALIVE`` by default) for ``pools.IDLE_FOR`` seconds; no cap on those in use."""
    options: dict[str, Any] = {
        "ssl_context": ssl_context,
        "max_connections": None,
        "max_keepalive_connections": KEEP_ALIVE if keep_alive is None else keep_alive,
        "keepalive_expiry": IDLE_FOR,
        "network_backend": _GuardedBackend(),
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
