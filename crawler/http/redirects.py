"""Redirects: the request a redirect's target is made with, and a page's meta refresh taken as one.

A 3xx's target is not followed inline: the download job sends it through the frontier as
a request of its own (``crawler.work.jobs``). A page whose ``<meta http-equiv="refresh">``
sends the browser on at once (or within ``META_REFRESH_MAX_DELAY`` seconds) is a redirect
stub written in HTML, common on documentation sites and old servers (Rust's installed
docs hold some 15,000): browsers and Scrapy (``MetaRefreshMiddleware``) go on to its
target instead of reading it, and so does the crawler. A redirect to another origin goes
without the request's credentials (``CREDENTIALS``), as in browsers and httpx.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from w3lib.html import get_meta_refresh
from w3lib.url import canonicalize_url

from ..spiders.decoding import html_text
from .fetch import Response

#: A meta refresh sooner than this many seconds is a redirect (Scrapy's ``METAREFRESH_MAXDELAY``);
#: a later one is a page that reloads itself now and then, read as it is.
META_REFRESH_MAX_DELAY = 100.0

#: Bytes of a page looked at for a meta refresh: its head, where the element belongs (Scrapy reads
#: the first 4,096 characters); a whole page of 100 KB took 0.1 ms only to search for the word.
META_REFRESH_SCOPE = 4096

#: Request headers that carry credentials: not sent on to a redirect's target of another origin (scheme,
#: host or port), as browsers (the Fetch standard), httpx (``_redirect_headers``) and Scrapy drop them.
CREDENTIALS = frozenset({"authorization", "proxy-authorization", "cookie"})
#: A credential header of this value in a request's headers is not sent, nor the spider's of that name
#: (``withheld``): what a redirect to another origin leaves in its target's request.
WITHHELD = ""

_DEFAULT_PORTS = {"http": 80, "https": 443}

#: The declaration a meta refresh needs, looked for in the bytes before anything is decoded.
_DECLARED = re.compile(rb"http-equiv\s*=\s*[\"']?\s*refresh", re.IGNORECASE)


def meta_refresh_target(url: str, body: bytes, charset: str | None = None) -> str | None:
    """The absolute URL the page at ``url`` refreshes to within META_REFRESH_MAX_DELAY s, or None.

    Only the first ``META_REFRESH_SCOPE`` bytes are read. None when they hold no meta refresh,
    a later one, one without a URL or to the page itself (a reload), or one only inside
    ``<script>`` or ``<noscript>`` (as Scrapy, which w3lib's ``get_meta_refresh`` reads it for).
    ``charset``: the Content-Type header's; the bytes are decoded as ``Page`` decodes a body.
    """
    head = body[:META_REFRESH_SCOPE]
    if b"refresh" not in head.lower() or not _DECLARED.search(head):
        return None
    text = html_text(head, charset)
    delay, target = get_meta_refresh(text, url)
    if target is None or delay is None or delay >= META_REFRESH_MAX_DELAY:
        return None
    if canonicalize_url(target, keep_fragments=False) == canonicalize_url(url, keep_fragments=False):
        return None
    return str(target)


def refresh_target(response: Response) -> str | None:
    """``meta_refresh_target`` of an HTML response (one without a content type counts as HTML); None for any other."""
    if not response.is_html:
        return None
    return meta_refresh_target(response.url, response.body, response.encoding)


def redirected_request(
    status: int,
    method: str,
    headers: Mapping[str, str],
    body: bytes | None,
    source: str,
    target: str,
    site_headers: Mapping[str, str] | None = None,
) -> tuple[str, dict[str, str], bytes | None]:
    """The method, headers and body a redirect from ``source`` to ``target`` is requested with, as
    browsers and httpx do: a 303 turns any method but HEAD into a GET, a 301 or 302 turns a POST into
    one, and such a GET goes without the body and its Content-Type; a 307 or 308 keeps method and body.

    A target of another origin (``same_origin``) goes without the credentials (``CREDENTIALS``) of
    ``headers`` or of ``site_headers`` (the spider's, sent with each request): they are WITHHELD."""
    if (status == 303 and method != "HEAD") or (status in (301, 302) and method == "POST"):
        dropped = ("content-type", "content-length", "content-encoding")
        method, headers, body = "GET", {k: v for k, v in headers.items() if k.lower() not in dropped}, None
    if same_origin(source, target):
        return method, dict(headers), body
    named = {name.lower() for name in [*headers, *(site_headers or {})] if name.lower() in CREDENTIALS}
    kept = {k: v for k, v in headers.items() if k.lower() not in CREDENTIALS}
    return method, {**kept, **dict.fromkeys(sorted(named), WITHHELD)}, body


def withheld(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` as sent: without the credentials a redirect to another origin WITHHELD."""
    return {k: v for k, v in headers.items() if not (v == WITHHELD and k.lower() in CREDENTIALS)}


def same_origin(one: str, other: str) -> bool:
    """Whether two URLs have one origin: scheme, host and port (the scheme's own when none is given)."""
    try:
        return _origin(one) == _origin(other)
    except ValueError:  # a port that is no number
        return False


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, parts.hostname, parts.port or _DEFAULT_PORTS.get(scheme)
