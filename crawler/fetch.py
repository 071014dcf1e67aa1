"""HTTP: one GET with caps on body size and time, no redirects followed inline.

A ``Fetcher`` keeps one httpx connection pool for the life of a worker process.
Redirects come back as responses (each hop is a request of its own that passes the
site's gate). httpx exceptions are translated into ``crawler.errors`` here, and only
here.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from .errors import BodyTooLarge, ConnectError, FetchTimeout

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


class Fetcher:
    """Downloads URLs through one pooled httpx client, within body and time caps."""

    def __init__(self, timeout: float, max_body_bytes: int, user_agent: str):
        self.timeout = timeout
        self.max_body_bytes = max_body_bytes
        self.client = httpx.Client(
            follow_redirects=False,
            timeout=httpx.Timeout(timeout),
            headers={"user-agent": user_agent, "accept": "text/html,application/xhtml+xml,*/*;q=0.8"},
            limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
        )

    def get(self, url: str, user_agent: str | None = None, on_sent: Callable[[], Any] | None = None) -> Response:
        """GET ``url``. Raises TransientError (timeouts, connection) or BodyTooLarge.

        ``on_sent()`` is called once the request has been written to the connection,
        before the response is read (the gate is rearmed there).
        """
        headers = {"user-agent": user_agent} if user_agent else None
        extensions = {"trace": _on_sent_tracer(on_sent)} if on_sent else None
        started = datetime.now(UTC)
        clock = time.monotonic()
        deadline = clock + self.timeout
        try:
            with self.client.stream("GET", url, headers=headers, extensions=extensions) as response:
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > self.max_body_bytes:
                    raise BodyTooLarge(f"Content-Length {declared} exceeds the cap of {self.max_body_bytes} bytes")
                chunks: list[bytes] = []
                size = 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > self.max_body_bytes:
                        raise BodyTooLarge(f"body exceeds the cap of {self.max_body_bytes} bytes")
                    if time.monotonic() > deadline:
                        raise FetchTimeout(f"body took longer than {self.timeout:g}s")
                    chunks.append(chunk)
                return Response(
                    url=url,
                    status=response.status_code,
                    headers={k.lower(): v for k, v in response.headers.items()},
                    body=b"".join(chunks),
                    started=started,
                    elapsed=time.monotonic() - clock,
                    encoding=response.charset_encoding,
                )
        except httpx.TimeoutException as exc:
            raise FetchTimeout(f"timed out: {type(exc).__name__}") from exc
        except httpx.DecodingError as exc:
            raise ConnectError(f"undecodable body: {exc}") from exc
        except (httpx.TransportError, httpx.StreamError) as exc:
            raise ConnectError(f"{type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        self.client.close()


def _on_sent_tracer(on_sent: Callable[[], Any]) -> Callable[[str, dict[str, Any]], None]:
    """An httpcore trace hook that calls ``on_sent`` when the response starts being awaited."""

    def trace(event: str, info: dict[str, Any]) -> None:
        if event.endswith("receive_response_headers.started"):
            on_sent()

    return trace
