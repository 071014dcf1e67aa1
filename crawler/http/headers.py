"""Headers as the fetcher sends and reads them: encoded, decoded, joined, their charset, Retry-After, merged."""

from __future__ import annotations

import email.message
import email.utils
import functools
import time
from collections.abc import Mapping
from datetime import UTC


def encode_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """``headers`` as sent: ASCII only, as httpx sends them (UnicodeEncodeError otherwise; AttributeError
    for a name or value that is not a string), but for ``Cookie``, one character a byte (Latin-1): the
    jar sends cookies back as the bytes received (``Response.set_cookies``)."""
    return [
        (name.encode("ascii"), value.encode("latin-1" if name.lower() == "cookie" else "ascii"))
        for name, value in headers.items()
    ]


def decode_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """A response's headers as text, names in lower case, decoded as httpx decodes them: ASCII,
    else UTF-8, else Latin-1, whichever reads every one of them."""
    for encoding in ("ascii", "utf-8"):
        try:
            return [(name.decode(encoding).lower(), value.decode(encoding)) for name, value in raw]
        except UnicodeDecodeError:
            continue
    return [(name.decode("latin-1").lower(), value.decode("latin-1")) for name, value in raw]


def first_header(headers: list[tuple[str, str]], name: str) -> str | None:
    return next((value for key, value in headers if key == name), None)


def join_headers(headers: list[tuple[str, str]]) -> dict[str, str]:
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
    # Cached: a site sends the same few values, and the email parser is slow on the download path.
    # Bounded: a server sending a new value each time only evicts.
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


#: Response headers handed on to the parse step first (``page.headers``); the others follow
#: within HANDED_HEADER_BYTES, but for Set-Cookie (a secret, of no use to a callback).
KEPT_HEADERS = ("content-type", "last-modified", "etag", "content-language")


#: Bytes of names and values of the response headers a page carries to its callback: enough for a
#: JSON API's Link or X-Total-Count, while a server sending megabytes of headers adds little to the stream.
HANDED_HEADER_BYTES = 8 * 1024


def handed_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The response headers a page's callback sees: ``KEPT_HEADERS``, then the others in their order
    while their names and values add up to ``HANDED_HEADER_BYTES`` (never Set-Cookie)."""
    handed = {k: headers[k] for k in KEPT_HEADERS if k in headers}
    room = HANDED_HEADER_BYTES - sum(len(k) + len(v) for k, v in handed.items())
    for name, value in headers.items():
        if name in handed or name == "set-cookie":
            continue
        room -= len(name) + len(value)
        if room < 0:
            break
        handed[name] = value
    return handed
