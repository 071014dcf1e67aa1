"""URLs as the crawler takes them: one canonical spelling, http(s) only, within a site's domains, not too long.

Pure functions of the URL (no Redis, no network): ``canonicalize`` (w3lib's
``canonicalize_url``, with shortcuts for the plain URLs most links are), ``host_allowed``,
``canonicalize_within`` a length cap, ``check_url`` all of them, and ``BatchChecker`` for a
page's links, which repeat. Every URL the frontier admits has passed ``check_url``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

from w3lib.url import canonicalize_url, safe_url_string

from .errors import RefusedURL

_DEFAULT_PORTS = {"http": 80, "https": 443}


def canonicalize(url: str) -> str:
    """The one spelling of ``url`` used for dedup and requests.

    Raises RefusedURL for anything but an absolute http(s) URL with a valid host.
    """
    url = url.strip()
    plain = _CANONICAL.fullmatch(url)
    if plain is not None and _is_plain(plain):
        return plain["url"]  # what canonicalize_url would return, at a fraction of the cost
    plain = _CANONICAL_QUERY.fullmatch(url)
    if plain is not None and _is_plain(plain):
        # Catalogue URLs carry simple queries (?page=2&sort=price): canonicalize_url only
        # sorts their fields, for 20 us a URL; this does the same sort in about 1 us.
        return f"{plain['url']}?{'&'.join(sorted(plain['query'].split('&'), key=_query_field_order))}"
    scheme, port = _checked_origin(url)
    try:
        canonical = canonicalize_url(url, keep_fragments=False)
    except (ValueError, UnicodeError) as exc:
        raise RefusedURL(f"malformed URL {url!r}: {exc}") from None
    if port == _DEFAULT_PORTS[scheme]:
        parts = urlsplit(canonical)
        netloc = parts.netloc.rsplit(":", 1)[0]
        canonical = urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
    return canonical


#: The origin and path of a URL that canonicalizes to itself: http(s), a lowercase host
#: name or a dotted IPv4 address without leading zeros, maybe a port (group ``port``: no
#: leading zero, checked to be in range and not the scheme's default), no user, and a
#: path of unreserved characters and sub-delimiters but ";" (no escapes to normalize, no
#: parameters). Dot segments are excluded separately ("/." nowhere).
_PLAIN_URL = (
    r"(?P<url>https?://(?:(?:[a-z0-9-]+\.)*[a-z][a-z0-9-]*"
    r"|(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))"
    r"(?::(?P<port>[1-9]\d{0,4}))?/[\w.~!$&'()*+,=:@/-]*)"
)
#: Such URLs with no query and an ASCII fragment if any: their canonical form is group ``url``.
_CANONICAL = re.compile(_PLAIN_URL + r"(?:#[\x00-\x7f]*)?", re.ASCII)


def _is_plain(match: re.Match[str]) -> bool:
    """Whether a ``_PLAIN_URL`` match is its own canonical form: no dot segment, a port that stays."""
    if "/." in match["url"]:
        return False
    port = match["port"]
    return port is None or (int(port) <= 65535 and int(port) != _DEFAULT_PORTS[match["url"].split(":", 1)[0]])


#: The same URLs with a query of ``key=value`` fields (group ``query``) whose characters
#: canonicalize_url leaves as they are (unreserved, and "+" for a space), none empty, none
#: without "=".
_CANONICAL_QUERY = re.compile(
    _PLAIN_URL + r"\?(?P<query>[\w.~+-]+=[\w.~+-]*(?:&[\w.~+-]+=[\w.~+-]*)*)(?:#[\x00-\x7f]*)?", re.ASCII
)


def _query_field_order(field: str) -> tuple[str, str]:
    """canonicalize_url's order of query fields: by key, then value, each with "+" read as a space."""
    key, _, value = field.partition("=")
    return key.replace("+", " "), value.replace("+", " ")


def _check_origin(url: str) -> tuple[str, int | None]:
    """The lowercased scheme and the port of a stripped ``url``; RefusedURL unless http(s) with a valid host."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise RefusedURL(f"malformed URL {url!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise RefusedURL(f"not an http(s) URL: {url!r}")
    host = (parts.hostname or "").lower()
    if not host or any(c.isspace() for c in host) or "%" in host:
        raise RefusedURL(f"URL has no valid host: {url!r}")
    return scheme, port


#: ``scheme://authority`` at the start of a URL, as ``urlsplit`` reads it when the URL has no tab or newline.
_ORIGIN = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)")


@functools.lru_cache(maxsize=1024)
def _check_origin_once(scheme: str, netloc: str) -> tuple[str, int | None]:
    return _check_origin(f"{scheme}://{netloc}")


def _checked_origin(url: str) -> tuple[str, int | None]:
    """``_check_origin(url)``, computed once per scheme and authority: a page's links share a few."""
    origin = _ORIGIN.match(url)
    # urlsplit drops tabs and newlines anywhere in a URL, which could move the authority's end.
    if origin is None or "\t" in url or "\n" in url or "\r" in url:
        return _check_origin(url)
    try:
        return _check_origin_once(origin[1], origin[2])
    except RefusedURL:
        return _check_origin(url)  # again, for the message naming the whole URL


def host_allowed(url: str, domains: Iterable[str]) -> bool:
    """Whether ``url``'s host is one of ``domains`` or a subdomain of one."""
    host = (urlsplit(url).hostname or "").lower()
    return any(host == d or host.endswith("." + d) for d in domains)


#: Characters of a refused URL quoted in the refusal (the rest would only bloat records and logs).
QUOTED = 100


def _byte_length(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def canonicalize_within(url: str, max_length: int | None) -> str:
    """``canonicalize(url)``; RefusedURL if it is longer than ``max_length`` bytes (None: no limit).

    Both spellings count: the URL as written (surrounding whitespace and fragment aside),
    checked before any work on it, so a megabyte URL costs no canonicalization (w3lib
    takes seconds on a long query), and its canonical form, which percent-encoding may
    make longer. The refusal quotes the URL's first ``QUOTED`` characters, not all of it.
    """
    if max_length is None:
        return canonicalize(url)
    written = url.strip().partition("#")[0]
    length = _byte_length(written)
    if length <= max_length:
        canonical = canonicalize(url)
        length = _byte_length(canonical)
        if length <= max_length:
            return canonical
    raise _too_long(written, length, max_length)


def _too_long(url: str, length: int, max_length: int) -> RefusedURL:
    return RefusedURL(f"URL longer than {max_length:,} bytes ({length:,}): {url[:QUOTED]!r}...")


def check_url(url: str, domains: list[str], max_length: int | None = None) -> str:
    """The canonical ``url``, or RefusedURL unless it is a valid http(s) URL within ``domains``
    and at most ``max_length`` bytes long (``canonicalize_within``; None: no limit)."""
    canonical = canonicalize_within(url, max_length)
    if not host_allowed(canonical, domains):
        raise RefusedURL(f"{canonical} is outside the allowed domains ({', '.join(domains)})")
    return canonical


class BatchChecker:
    """``check_url`` for one batch of URLs, remembering outcomes: a page repeats its links.

    A URL is canonicalized once per spelling, and spellings that differ only in an ASCII
    fragment (``#sec-1``, ``#sec-2``) share one canonicalization, since it drops the
    fragment. Allowed domains are checked once per authority.
    """

    def __init__(self, domains: list[str], max_length: int | None):
        self.domains = domains
        self.max_length = max_length
        self.by_url: dict[str, str | RefusedURL] = {}  # url as given -> canonical URL or refusal
        self.by_page: dict[str, str | RefusedURL] = {}  # stripped url without its fragment -> same
        self.hosts: dict[str, bool] = {}  # scheme://authority of a canonical URL -> allowed

    def check(self, url: str) -> str:
        """``check_url(url, domains, max_length)``."""
        outcome = self.by_url.get(url)
        if outcome is None:
            outcome = self.by_url[url] = self._outcome(url)
        if isinstance(outcome, RefusedURL):
            raise RefusedURL(str(outcome))
        return outcome

    def _outcome(self, url: str) -> str | RefusedURL:
        page, _, fragment = url.strip().partition("#")
        # An ASCII fragment never changes the outcome (it is dropped); any other might not encode.
        shared = fragment.isascii()
        outcome = self.by_page.get(page) if shared else None
        if outcome is not None:
            return outcome
        try:
            canonical = canonicalize_within(url, self.max_length)
        except RefusedURL as exc:
            return exc  # its message names the URL as given: not shared
        outcome = canonical
        if not self._allowed(canonical):
            outcome = RefusedURL(f"{canonical} is outside the allowed domains ({', '.join(self.domains)})")
        if shared:
            self.by_page[page] = outcome
        return outcome

    def _allowed(self, canonical: str) -> bool:
        origin = _ORIGIN.match(canonical)
        if origin is None:  # not expected of a canonical URL, but then no shortcut
            return host_allowed(canonical, self.domains)
        allowed = self.hosts.get(origin[0])
        if allowed is None:
            allowed = self.hosts[origin[0]] = host_allowed(origin[0], self.domains)
        return allowed


def as_written(url: str, canonical: str) -> str | None:
    """``url`` as the spider wrote it, to be sent so (Scrapy sends it so): its fragment dropped and
    what may not stand in a request line percent-encoded (w3lib's ``safe_url_string``, as browsers
    do); None when that is ``canonical`` (most links: one spelling to carry, not two), or when it would
    not canonicalize back to ``canonical`` (a spelling the two read apart, such as a space before the
    fragment: the canonical URL is sent). Dedup, records and items keep to ``canonical``."""
    written = url.strip().split("#", 1)[0]
    if written == canonical:
        return None
    safe = safe_url_string(written)
    if safe == canonical:
        return None
    try:
        return safe if canonicalize(safe) == canonical else None
    except RefusedURL:
        return None


def short_enough(canonical: str, max_length: int) -> str:
    """A URL ``check_url`` passed, refused (RefusedURL) if longer than ``max_length`` bytes after all."""
    length = _byte_length(canonical)
    if length > max_length:
        raise _too_long(canonical, length, max_length)
    return canonical
