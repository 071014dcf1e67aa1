"""The spider author's API: ``Spider``, ``Request``, ``Page``, and spider discovery.

A spider is a class in a module under the sites directory. Callbacks take a ``Page``
and yield items (dicts) and ``Request`` objects; requests name their callback by
method, so they can travel through Redis as plain data.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

from selectolax.lexbor import LexborHTMLParser, LexborNode

from .errors import SpiderLoadError

Callback = Callable[["Page"], Iterable[Any]] | str | None


def callback_name(callback: Callback) -> str:
    """The method name a callback is stored under (``parse`` when none is given)."""
    if callback is None:
        return "parse"
    if isinstance(callback, str):
        return callback
    name = getattr(callback, "__name__", None)
    if not name or getattr(callback, "__self__", None) is None:
        raise TypeError(f"callback must be a spider method or its name, got {callback!r}")
    return str(name)


@dataclass
class Request:
    """A URL to download and the spider method that will parse it.

    ``meta`` is plain JSON data handed to the callback as ``page.meta``.
    ``priority``: of a site's queued requests, the highest is fetched first (seeds 10,
    links 0, scheduled refreshes -10 by default; -1000 to 1000).
    ``dont_filter`` skips the seen-set, for pages that must be fetched again.
    ``refresh``: fetch the page again this many seconds after each fetch (overrides
    the spider's ``refresh`` rule for this request).
    """

    url: str
    callback: Callback = None
    meta: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    dont_filter: bool = False
    refresh: float | None = None

    def __post_init__(self) -> None:
        self.callback = callback_name(self.callback)


class Page:
    """A downloaded HTML page: its URL, status, headers and a selectolax DOM."""

    def __init__(
        self,
        url: str,
        body: bytes,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        meta: dict[str, Any] | None = None,
        encoding: str | None = None,
    ):
        self.url = url
        self.body = body
        self.status = status
        self.headers = {k.lower(): v for k, v in (headers or {}).items()}
        self.meta = meta or {}
        self._encoding = encoding
        self._tree: LexborHTMLParser | None = None

    @property
    def tree(self) -> LexborHTMLParser:
        """The parsed document (parsed on first use)."""
        if self._tree is None:
            self._tree = LexborHTMLParser(self.text_content)
        return self._tree

    @property
    def text_content(self) -> str:
        """The body decoded with the declared charset, replacing invalid bytes."""
        encoding = self._encoding or "utf-8"
        try:
            return self.body.decode(encoding, errors="replace")
        except LookupError:  # an unknown charset name
            return self.body.decode("utf-8", errors="replace")

    def css(self, selector: str) -> list[LexborNode]:
        """Every node matching a CSS selector."""
        return list(self.tree.css(selector))

    def css_first(self, selector: str, default: Any = None) -> Any:
        """The first node matching a CSS selector, or ``default``."""
        return self.tree.css_first(selector, default=default)

    def text(self, selector: str | None = None, strip: bool = True, default: str = "") -> str:
        """Text of the first match of ``selector`` (of the whole body when None)."""
        node = self.tree.body if selector is None else self.tree.css_first(selector)
        if node is None:
            return default
        return str(node.text(strip=strip))

    def urljoin(self, href: str) -> str:
        """``href`` made absolute against this page's URL (``<base href>`` honoured)."""
        base = self.tree.css_first("base[href]")
        base_url = urljoin(self.url, base.attributes.get("href") or "") if base else self.url
        return urljoin(base_url, href.strip())

    def follow(self, href: str | LexborNode, callback: Callback = None, **kwargs: Any) -> Request:
        """A request for a link, relative to this page; ``href`` may be an ``<a>`` node."""
        if isinstance(href, LexborNode):
            href = href.attributes.get("href") or ""
        return Request(self.urljoin(href), callback=callback, **kwargs)

    def follow_all(self, css: str, callback: Callback = None, **kwargs: Any) -> Iterator[Request]:
        """Requests for the ``href`` of every node matching ``css`` that has one."""
        for node in self.css(css):
            href = node.attributes.get("href")
            if href and href.strip():
                yield self.follow(href, callback=callback, **kwargs)

    def __repr__(self) -> str:
        return f"<Page {self.status} {self.url}>"


class Spider:
    """Base class for one site's spider. Subclass it in a module under ``sites/``.

    Class attributes are the site's defaults; config, environment and ``crawler set``
    may override the politeness ones.
    """

    #: Unique site name; also names the site's queue and gate.
    name: str = ""
    #: URLs seeded when ``crawler seed SITE`` is given none.
    start_urls: list[str] = []
    #: Hosts (and their subdomains) the spider may request; empty means the start URLs' hosts.
    allowed_domains: list[str] = []
    #: Seconds between two requests to this site, across every worker on every host.
    interval: float = 1.0
    #: Item field whose value identifies an item; None keys items by page URL and position.
    item_key: str | None = None
    #: Honour robots.txt.
    obey_robots: bool = True
    #: User-Agent header sent with every request.
    user_agent: str | None = None
    #: Follow redirects from a public host to private or loopback addresses (refused by default).
    allow_private_addresses: bool = False
    #: Refetch pages on a schedule: seconds between fetches for every page, or a mapping
    #: from callback name to seconds (``{"parse_product": 86400}``); None never refetches.
    refresh: float | Mapping[str, float] | None = None
    #: Priority of scheduled refreshes, below new pages (0) and seeds (10) by default.
    refresh_priority: int = -10

    def refresh_for(self, request: Request) -> float | None:
        """Seconds after which ``request``'s page is to be fetched again, or None."""
        if request.refresh is not None:
            return request.refresh
        if isinstance(self.refresh, Mapping):
            value = self.refresh.get(str(request.callback))
            return None if value is None else float(value)
        return None if self.refresh is None else float(self.refresh)

    def parse(self, page: Page) -> Iterable[Any]:
        """Default callback: override it."""
        raise NotImplementedError(f"{type(self).__name__}.parse is not defined")

    def start_requests(self) -> Iterator[Request]:
        """Requests seeded when no URL is given on the command line."""
        for url in self.start_urls:
            yield Request(url)

    def callback(self, name: str) -> Callable[[Page], Iterable[Any]]:
        """The bound method a request names; raises AttributeError for an unknown one."""
        method = getattr(self, name, None)
        if not callable(method) or name.startswith("_"):
            raise AttributeError(f"spider {self.name!r} has no callback {name!r}")
        return method  # type: ignore[no-any-return]

    def domains(self) -> list[str]:
        """The allowed domains, defaulting to the start URLs' hosts."""
        if self.allowed_domains:
            return [d.lower().lstrip(".") for d in self.allowed_domains]
        from urllib.parse import urlsplit

        return sorted({(urlsplit(u).hostname or "").lower() for u in self.start_urls} - {""})


@dataclass
class SpiderSet:
    """Spiders found in a directory, and the modules that failed to load."""

    spiders: dict[str, type[Spider]]
    errors: list[SpiderLoadError]

    def get(self, name: str) -> type[Spider]:
        """The spider class named ``name``; ConfigError naming the known ones if none."""
        from .errors import ConfigError

        if name in self.spiders:
            return self.spiders[name]
        for error in self.errors:
            if error.module == name:
                raise error
        known = ", ".join(sorted(self.spiders)) or "none"
        raise ConfigError(f"unknown site {name!r} (known: {known})")


def load_spiders(directory: str | Path, extra: Iterable[type[Spider]] = ()) -> SpiderSet:
    """Import every ``*.py`` module in ``directory`` and collect its Spider subclasses.

    A module that fails to import is reported in ``errors`` by name; the others load.
    ``extra`` spiders (the bundled demo) are added as if found there.
    """
    spiders: dict[str, type[Spider]] = {s.name: s for s in extra}
    errors: list[SpiderLoadError] = []
    path = Path(directory)
    for file in sorted(path.glob("*.py")) if path.is_dir() else []:
        if file.name.startswith("_"):
            continue
        try:
            module = _import_file(file)
        except Exception as exc:  # any error in user code is reported, not raised
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            errors.append(SpiderLoadError(file.stem, last))
            continue
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Spider) and obj is not Spider and obj.name:
                if obj.__module__ == module.__name__:
                    spiders[obj.name] = obj
    return SpiderSet(spiders, errors)


def _import_file(file: Path) -> Any:
    module_name = f"crawler_sites.{file.stem}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module
