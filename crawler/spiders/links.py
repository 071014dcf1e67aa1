"""A page's links made absolute against its base URL, the work shared between the hrefs a page repeats."""

from __future__ import annotations

import re
from typing import Protocol
from urllib.parse import urljoin, urlsplit

#: An href urljoin appends to what its prefix resolves to: a prefix of "/" or of "./" and
#: "../" steps, then path segments of plain characters (none empty, none a dot segment, no
#: ":" that could start a scheme, no ";" parameters, no "%" escapes), then an optional query.
_SEGMENT = r"[\w!$&'()*+,=@~-][\w.!$&'()*+,=@~-]*"
_PLAIN_HREF = re.compile(rf"(/|(?:\.\.?/)*)((?:{_SEGMENT}/)*(?:{_SEGMENT})?)(?:\?([^#\t\n\r]*))?", re.ASCII)

#: An absolute http(s) URL that urljoin returns as it is, whatever the base: lowercase
#: scheme, plain host and port, no ";" parameters, a non-empty query if any.
_PLAIN_ABSOLUTE_HREF = re.compile(
    r"https?://[A-Za-z0-9.-]+(?::[0-9]+)?(?:/[\w.~!$&'()*+,=:@/%-]*)?(?:\?[^#\t\n\r]+)?", re.ASCII
)

#: Distinct hrefs (and targets) whose joins a page keeps (``Page.urljoin``): the links a page repeats
#: (nav, "back to top", an API name in every table) are joined once, and a page of 100,000 distinct
#: links holds this many joins at most, not all of them.
JOINS_KEPT = 10_000


class Based(Protocol):
    """What links resolve against: a page's ``base_url``, read only when a join needs it."""

    @property
    def base_url(self) -> str: ...


class Joins:
    """``urljoin(page.base_url, href)`` for one page's hrefs, with the work shared between similar hrefs.

    The page is passed to each call, not kept: its base URL is read (its document searched)
    only when a join needs it, and the page holds this object without a reference cycle.
    """

    def __init__(self) -> None:
        self._targets: dict[str, str] = {}  # href without its fragment -> absolute URL
        self._directories: dict[str, str] = {}  # "", "/", "../" ... -> what it resolves to, with "/"
        self._hierarchical: bool | None = None

    def join(self, href: str, page: Based) -> str:
        """``urljoin(page.base_url, href)`` for a stripped ``href``.

        urljoin carries a non-empty fragment through untouched (unless it holds a tab or
        newline, which urlsplit deletes), so a table of contents or a page of line anchors costs
        one join per target, not per anchor. A plain absolute URL is returned as it is,
        and a plain relative path is appended to what its leading ``/``, ``./`` or
        ``../`` resolve to, which is joined once per page.
        """
        target, _, fragment = href.partition("#")
        if not fragment or "\t" in fragment or "\n" in fragment or "\r" in fragment:
            return self._join_target(href, page)
        joined = self._targets.get(target)
        if joined is None:
            if len(self._targets) >= JOINS_KEPT:
                self._targets.clear()
            # A bare "#..." takes the base without its fragment (urljoin(base, "") would keep it).
            joined = self._join_target(target, page) if target else urljoin(page.base_url, "#x")[:-2]
            self._targets[target] = joined
        return f"{joined}#{fragment}"

    def _join_target(self, href: str, page: Based) -> str:
        if _PLAIN_ABSOLUTE_HREF.fullmatch(href):
            return href
        plain = _PLAIN_HREF.fullmatch(href) if self._base_is_hierarchical(page) else None
        if plain is None or not (plain[1] or plain[2]):
            return urljoin(page.base_url, href)
        prefix, path, query = plain.groups()
        directory = self._directories.get(prefix)
        if directory is None:
            # urljoin resolves the prefix against the base as for any path after it.
            directory = self._directories[prefix] = urljoin(page.base_url, prefix + "x")[:-1]
        return f"{directory}{path}?{query}" if query else directory + path

    def _base_is_hierarchical(self, page: Based) -> bool:
        """Whether the base URL is one urljoin resolves paths against (http(s) with a host)."""
        if self._hierarchical is None:
            parts = urlsplit(page.base_url)
            self._hierarchical = parts.scheme in ("http", "https") and bool(parts.netloc)
        return self._hierarchical
