"""The spider author's API: ``Spider``, ``Request``, ``Page``, and spider discovery.

A spider is a class in a module under the sites directory. Callbacks take a ``Page``
and yield items (dicts, dataclasses, attrs classes, pydantic models: ``items``) and
``Request`` objects; requests name their callback by method, so they can travel
through Redis as plain data.
"""

from __future__ import annotations

import json as jsonlib
import re
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, InitVar, dataclass, field
from functools import cached_property
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit, urlunsplit

from selectolax.lexbor import LexborHTMLParser, LexborNode

from ..errors import ConfigError
from ..settings import Auto
from .decoding import html_text, is_json, json_text
from .extensions import IGNORED_EXTENSIONS
from .forms import form_fields
from .links import JOINS_KEPT, Joins
from .rules import Patterns, Rule, patterns, url_allowed, with_rules

#: What ``Page.text_of`` makes one space: XPath's whitespace (a no-break space is text, not spacing).
_SPACES = re.compile(r"[ \t\n\r\f]+")

Callback = Callable[["Page"], Iterable[Any]] | str | None

#: Content types of HTML: the responses a spider's callbacks get by default (``Spider.content_types``).
HTML_TYPES = ("text/html", "application/xhtml+xml")


def accepts(content_types: Iterable[str], content_type: str) -> bool:
    """Whether a response of ``content_type`` (lower case, no parameters) goes to a callback of a
    spider with these ``content_types``: one equal to it, or ``major/*`` of its family. An empty one
    (no Content-Type header) counts as HTML."""
    if not content_type:
        return any(accepts(content_types, html) for html in HTML_TYPES)
    family = content_type.split("/", 1)[0] + "/*"
    return any(accepted in (content_type, family, "*/*") for accepted in content_types)


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


#: HTTP methods a request may name (what a crawler has use for; CONNECT and TRACE are not requests for pages).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
#: Content types ``json=`` and ``form=`` send, unless the request's headers name one.
JSON_TYPE = "application/json"
FORM_TYPE = "application/x-www-form-urlencoded"


@dataclass
class Request:
    """A URL to download, how (method, headers, body), and the spider method that will parse it.

    ``method``: an HTTP method (GET by default). ``headers`` are sent with the request, over
    the spider's ``headers``. The body is given one way at most: ``body`` (bytes, or text sent
    as UTF-8), ``json=`` (any JSON value, sent as ``application/json``), or ``form=`` (a mapping
    of fields, or (field, value) pairs, sent as ``application/x-www-form-urlencoded``; with GET
    the fields go into the URL's query instead, as a browser sends a GET form). Deduplication
    tells requests apart by method and body as well as URL (headers do not count, as in
    Scrapy's fingerprint); a GET without a body is fingerprinted by its URL alone.
    ``meta`` is plain JSON data handed to the callback as ``page.meta``.
    ``priority``: of a site's queued requests, the highest is fetched first (seeds 10,
    links 0, scheduled refreshes -10 by default; -1000 to 1000).
    ``dont_filter`` skips the seen-set, for pages that must be fetched again.
    ``errback``: the spider method (or its name) called with a ``Failure`` should the request
    finally fail (``crawler.spiders.failure``); the spider's ``errback`` when not given.
    ``refresh``: fetch the page again this many seconds after each fetch (overrides
    the spider's ``refresh`` rule for this request).
    ``render`` / ``render_wait``: render the page in a browser, and the CSS selector waited
    for (override the spider's ``render`` / ``render_wait``); carried in ``meta`` under
    those names, so retries, redirects and refreshes of the request keep them.
    Raises ValueError for an unknown method, headers that are not text, or two bodies.
    """

    url: str
    callback: Callback = None
    _: KW_ONLY
    method: str = "GET"
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    json: InitVar[Any] = None
    form: InitVar[Mapping[str, Any] | Iterable[tuple[str, Any]] | None] = None
    meta: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    dont_filter: bool = False
    refresh: float | None = None
    render: bool | None = None
    render_wait: str | None = None
    errback: Callback = None

    def __post_init__(self, json: Any, form: Mapping[str, Any] | Iterable[tuple[str, Any]] | None) -> None:
        self.callback = callback_name(self.callback)
        if self.errback is not None:
            self.errback = callback_name(self.errback)
        if self.meta is None:
            self.meta = {}
        if self.render is not None or self.render_wait is not None:
            rendering = {"render": self.render, "render_wait": self.render_wait}
            self.meta = {**self.meta, **{k: v for k, v in rendering.items() if v is not None}}
        if self.method != "GET" or self.headers or self.body is not None or json is not None or form is not None:
            self._prepare(json, form)
        elif self.headers is None:
            self.headers = {}
        # else the plain GET of nearly every link: nothing to check (a page may yield 100,000)

    def _prepare(self, json: Any, form: Mapping[str, Any] | Iterable[tuple[str, Any]] | None) -> None:
        """Check method and headers, and make the body of ``body``, ``json`` or ``form``."""
        self.method = str(self.method).upper()
        if self.method not in METHODS:
            raise ValueError(f"unknown HTTP method {self.method!r} (one of {', '.join(sorted(METHODS))})")
        self.headers = _checked_headers(self.headers)
        if sum(given is not None for given in (self.body, json, form)) > 1:
            raise ValueError("a request has one body: give body=, json= or form=, not two")
        if isinstance(self.body, str):
            self.body = self.body.encode()
        elif self.body is not None and not isinstance(self.body, bytes):
            raise ValueError(f"body must be bytes or text, not {type(self.body).__name__}")
        if json is not None:
            self.body = jsonlib.dumps(json, ensure_ascii=False, separators=(",", ":")).encode()
            self._default_header("Content-Type", JSON_TYPE)
        elif form is not None:
            fields = urlencode(list(form.items()) if isinstance(form, Mapping) else list(form), doseq=True)
            if self.method == "GET":
                self.url = _with_query(self.url, fields)
            else:
                self.body = fields.encode()
                self._default_header("Content-Type", FORM_TYPE)
        if self.body == b"":
            self.body = None  # no body and an empty one are one request (and one fingerprint)

    def _default_header(self, name: str, value: str) -> None:
        if not any(key.lower() == name.lower() for key in self.headers):
            self.headers[name] = value

    @property
    def is_plain(self) -> bool:
        """A GET without headers, body or errback: the compact default of a frontier entry."""
        return self.method == "GET" and not self.headers and self.body is None and self.errback is None


def _checked_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """``headers`` as a new dict of text names and values; ValueError for anything else."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise ValueError(f"headers must be a mapping of names to values, not {type(headers).__name__}")
    checked = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str) or not name.strip():
            raise ValueError(f"header {name!r}: names and values must be text, not {value!r}")
        checked[name] = value
    return checked


def _with_query(url: str, fields: str) -> str:
    """``url`` with its query replaced by ``fields`` (what a browser does with a GET form), fragment dropped."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, fields, ""))


@dataclass(frozen=True)
class SentRequest:
    """The request a page answers (``page.request``): its method, URL and the headers it was sent
    with beyond the fetcher's own (User-Agent, Accept, Accept-Encoding): the spider's ``headers``
    and the request's."""

    method: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)


class PageText(str):
    """The page's body as text (``page.text``, Scrapy's ``response.text``), which may also be called:
    ``page.text("h1")`` is the stripped text of a selector's first match (``Page.text_of``)."""

    #: The page, weakly: a strong reference would make a cycle (the page caches its text), and a
    #: page in a cycle, its DOM with it, waits for the garbage collector instead of going at once.
    _page: weakref.ref[Page]

    def __call__(self, selector: str | None = None, strip: bool = True, default: str = "") -> str:
        page = self._page()
        if page is None:
            raise ReferenceError("the page of this text is gone")
        return page.text_of(selector, strip, default)


class Page:
    """A downloaded page: its URL, status, headers, body, the request it answers, and (for HTML)
    a selectolax DOM.

    ``url`` and ``body`` are read once: the DOM, the base URL and resolved links are
    computed on first use and kept for the page's life, so that a page with N links
    costs O(N), not a document search per link. A page that is not HTML (JSON) is never
    parsed as HTML unless ``css`` and the like are asked for.
    """

    def __init__(
        self,
        url: str,
        body: bytes,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        meta: dict[str, Any] | None = None,
        encoding: str | None = None,
        request: SentRequest | None = None,
    ):
        self.url = url
        self.body = body
        self.status = status
        self.headers = {k.lower(): v for k, v in (headers or {}).items()}
        self.meta = meta or {}
        #: The request this page answers (method, URL, headers sent).
        self.request = request if request is not None else SentRequest("GET", url)
        self._encoding = encoding
        self._tree: LexborHTMLParser | None = None
        self._base_url: str | None = None
        # href as written -> absolute URL: real pages repeat links (nav, "back to top",
        # the same API name in every table), and urljoin is the costly step per link.
        self._joined: dict[str, str] = {}
        self._joins = Joins()  # the work shared between the hrefs missing from _joined

    @property
    def tree(self) -> LexborHTMLParser:
        """The parsed document (parsed on first use)."""
        if self._tree is None:
            self._tree = LexborHTMLParser(self.text_content)
        return self._tree

    @cached_property
    def text_content(self) -> str:
        """The body decoded, invalid bytes replaced, with the charset browsers would take.

        A byte-order mark first, then the ``Content-Type`` header's charset (``encoding``), then
        the page's own ``<meta charset>`` (or ``http-equiv``, or an XML declaration), then
        UTF-8 (``decoding.html_text``, as w3lib and Scrapy decode): many sites declare their
        charset only in the page. A JSON response is decoded as ``json()`` decodes it. A charset
        name that is no character set (``hex``, ``zlib``, unknown) counts as none.
        """
        if is_json(self.headers.get("content-type")):
            return json_text(self.body, self._encoding)
        return html_text(self.body, self._encoding)

    @cached_property
    def text(self) -> PageText:
        """The body as text (``text_content``); ``page.text("h1")`` is still the text of a selector (``text_of``)."""
        text = PageText(self.text_content)
        text._page = weakref.ref(self)
        return text

    def json(self) -> Any:
        """The body parsed as JSON (whatever its content type); ValueError if it is not JSON.

        Decoded as JSON is (``decoding.json_text``): a byte-order mark, else UTF-8, -16 or -32 by
        the first bytes, a ``Content-Type`` charset only if it names a character set, never a ``<meta>``.
        """
        return jsonlib.loads(json_text(self.body, self._encoding))

    def css(self, selector: str) -> list[LexborNode]:
        """Every node matching a CSS selector."""
        return list(self.tree.css(selector))

    def css_first(self, selector: str, default: Any = None) -> Any:
        """The first node matching a CSS selector, or ``default``."""
        return self.tree.css_first(selector, default=default)

    def text_of(self, selector: str | None = None, strip: bool = True, default: str = "") -> str:
        """Text of the first match of ``selector`` (of the whole body when None): ``page.text(selector)``.

        The text is the node's and its descendants' text joined as it stands in the page (the
        DOM's ``textContent``). ``strip``: each run of spaces, tabs and line breaks made one
        space, and the ends stripped (XPath's ``normalize-space``), so ``<h1>New <b>shoes</b></h1>``
        is "New shoes": words are never glued together, nor split where the page has no space.
        """
        node = self.tree.body if selector is None else self.tree.css_first(selector)
        if node is None:
            return default
        text = str(node.text(strip=False))
        return _SPACES.sub(" ", text).strip() if strip else text

    @property
    def base_url(self) -> str:
        """What relative links resolve against: the first ``<base href>`` (made absolute), else ``url``.

        The document is searched once per page, on first use.
        """
        if self._base_url is None:
            base = self.tree.css_first("base[href]")
            self._base_url = urljoin(self.url, base.attributes.get("href") or "") if base else self.url
        return self._base_url

    def urljoin(self, href: str) -> str:
        """``href`` made absolute against this page's URL (``<base href>`` honoured)."""
        joined = self._joined.get(href)
        if joined is None:
            if len(self._joined) >= JOINS_KEPT:
                self._joined.clear()
            joined = self._joined[href] = self._joins.join(href.strip(), self)
        return joined

    def follow(self, href: str | LexborNode, callback: Callback = None, **kwargs: Any) -> Request:
        """A request for a link, relative to this page; ``href`` may be an ``<a>`` node."""
        if isinstance(href, LexborNode):
            href = href.attributes.get("href") or ""
        return Request(self.urljoin(href), callback=callback, **kwargs)

    def follow_all(
        self, css: str, callback: Callback = None, *, allow: Patterns = (), deny: Patterns = (), **kwargs: Any
    ) -> Iterator[Request]:
        """Requests for the ``href`` of every node matching ``css`` that has one, in document order;
        with ``allow``/``deny`` (regexes, one or a list, searched in the absolute URL), those of the
        links one ``allow`` matches (any, without) and no ``deny`` does."""
        allowed, denied = patterns(allow), patterns(deny)
        for node in self.css(css):
            href = node.attributes.get("href")
            if href and href.strip():
                if (allowed or denied) and not url_allowed(self.urljoin(href), allowed, denied):
                    continue
                yield self.follow(href, callback=callback, **kwargs)

    def form(
        self,
        selector: str | None = None,
        data: Mapping[str, Any] | None = None,
        callback: Callback = None,
        **kwargs: Any,
    ) -> Request:
        """The Request that submits a form of this page, as a browser would (Scrapy's
        ``FormRequest.from_response``).

        The form is the first match of ``selector`` (a CSS selector of the form, or of a node
        inside it), else the page's first form; ValueError if there is none. Its fields go as
        a browser sends them: hidden inputs (CSRF tokens) included, checked checkboxes and
        radios, each select's selected options (else its first), textareas; not disabled
        fields nor those without a name. The first submit button with a name adds its
        name and value. ``data`` sets fields (replacing every value a field had, or adding
        it; a list value repeats the field; None drops it). The method and action are the
        form's (GET and the page's URL by default); a GET sends the fields as the action's
        query, a POST as a urlencoded body. ``kwargs`` go to ``Request`` (``meta``, ``headers``...).
        """
        form = self._form_node(selector)
        fields = list(form_fields(form))
        if data:
            fields = [(name, value) for name, value in fields if name not in data]
            for name, value in data.items():
                for one in value if isinstance(value, list | tuple) else [value]:
                    if one is not None:
                        fields.append((name, str(one)))
        method = (form.attributes.get("method") or "GET").strip().upper()
        action = (form.attributes.get("action") or "").strip()
        url = self.urljoin(action) if action else self.url
        return Request(url, callback, method="POST" if method == "POST" else "GET", form=fields, **kwargs)

    def _form_node(self, selector: str | None) -> LexborNode:
        node = self.css_first(selector) if selector else self.css_first("form")
        while node is not None and node.tag != "form":
            node = node.parent
        if node is None:
            where = f"matching {selector!r}" if selector else "on the page"
            raise ValueError(f"no form {where}: {self.url}")
        return node

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
    #: Seconds between two requests to this site, across every worker on every host; or
    #: ``Auto(min=…, max=…)``: an interval that follows the site's response times and errors.
    interval: float | Auto = 1.0
    #: What one gate spaces: "site" (this spider's requests), or "ip" (every request to one IP
    #: address, whichever spider or host name it is for: sites that share a server).
    gate_by: str = "site"
    #: A gate shared by name with other spiders (they are spaced as one site); None: gate_by.
    gate: str | None = None
    #: Item field whose value identifies an item; None keys items by page URL and position.
    item_key: str | None = None
    #: Honour robots.txt.
    obey_robots: bool = True
    #: An HTML page whose ``<meta http-equiv="refresh">`` sends on within 100 s is a redirect to its
    #: target (as in browsers and Scrapy), not a page for the callback; False hands it to the callback.
    follow_meta_refresh: bool = True
    #: User-Agent header sent with every request.
    user_agent: str | None = None
    #: Links followed from the start pages, at most: a start request is at depth 0, a request its
    #: page yields at 1, and so on; one beyond this is not queued (counted in its page's parse record).
    #: None: no limit. Redirects keep their request's depth.
    depth_limit: int | None = None
    #: New pages admitted to the site's frontier, fleet-wide (start requests, links, redirect
    #: targets: each page once, its retries and refreshes free); past it new requests are dropped,
    #: so the crawl drains. None: no limit.
    max_pages: int | None = None
    #: Requests taken from one page's callback, in the order it yields them; the rest are dropped
    #: (counted in its parse record). None: every link of a page is queued, however many.
    #: The ``max_links_per_page`` setting, when set, wins over this.
    max_links_per_page: int | None = None
    #: Headers sent with every request of the site, under each request's own (a name in both is the
    #: request's); a User-Agent here wins over ``user_agent`` and the setting.
    headers: Mapping[str, str] = {}
    #: Content types (``"text/html"``, or ``"application/*"`` for a whole family) of the responses
    #: handed to callbacks; others are recorded skipped. A response without a content type counts as HTML.
    content_types: tuple[str, ...] = HTML_TYPES
    #: Extensions (``"pdf"``, ``"tar.gz"``; any case) of links not followed: a request a callback yields
    #: whose URL path ends in one is not queued (counted in its page's parse record), unless
    #: ``content_types`` takes the extension's type (``application/pdf`` keeps ``.pdf`` links).
    #: Scrapy's ``IGNORED_EXTENSIONS`` by default; an empty set follows every link.
    deny_extensions: frozenset[str] | set[str] = IGNORED_EXTENSIONS
    #: The errback of a request that names none: a method's name, or define a method ``errback``
    #: (``crawler.spiders.failure``). None: failures are recorded only.
    errback: str | None = None
    #: Reach private, loopback or link-local addresses through host names (DNS) and redirects from
    #: public hosts (refused by default; a URL naming an IP address or localhost is always allowed).
    allow_private_addresses: bool = False
    #: Refetch pages on a schedule: seconds between fetches for every page, or a mapping
    #: from callback name to seconds (``{"parse_product": 86400}``); None never refetches.
    refresh: float | Mapping[str, float] | None = None
    #: Priority of scheduled refreshes, below new pages (0) and seeds (10) by default.
    refresh_priority: int = -10
    #: Seconds a seen URL stays seen (up to a quarter more), after which a link to it, or a
    #: seed, queues it again: a periodic re-crawl finds new and changed pages. None: for good.
    revisit_after: float | None = None
    #: Proxy URL(s) for this site's requests (``http://user:pass@host:port``), a list rotated per request;
    #: None: the ``proxy`` setting's; "" or []: direct. The gate stays the site's whatever the proxy.
    proxy: str | list[str] | None = None
    #: Sitemaps (or sitemap indexes, or robots.txt URLs, whose Sitemap: lines are read) to take URLs from;
    #: seeded with the start URLs (``crawler seed SITE``). Plain XML or gzipped, up to 50 MB each.
    sitemap_urls: list[str] = []
    #: (regex, callback name) pairs: a sitemap URL goes to the callback of the first regex found in it;
    #: a URL that matches none is not queued.
    sitemap_rules: list[tuple[str, str]] = [("", "parse")]
    #: Regexes: the sitemaps an index lists are followed when one is found in their URL (default: all).
    sitemap_follow: list[str] = [""]
    #: Also read the Sitemap: lines of the robots.txt of every origin of ``start_urls`` and ``sitemap_urls``.
    sitemap_follow_robots: bool = False
    #: Read ``sitemap_urls`` again every this many seconds (pages whose <lastmod> moved are fetched again).
    sitemap_refresh: float | None = None
    #: Send a refresh the page's last ETag / Last-Modified (If-None-Match / If-Modified-Since), so an
    #: unchanged page answers 304 and is not downloaded or parsed again. Off for servers that answer 304 wrongly.
    conditional_refresh: bool = True
    #: Pipelines every item of the site goes through after ``process_item``, in order: classes, or dotted
    #: paths to them (``"package.module.Class"``), each with ``process_item(item, spider, page)`` and optional
    #: ``open(spider)`` / ``close(spider)``; made and opened once per parse worker process (``items``).
    pipelines: list[type | str] = []
    #: Render pages in a headless Chromium (``render``) and hand callbacks the DOM once scripts
    #: have written it; per request: ``Request(url, render=True)``. Needs ``pip install -e '.[browser]'``.
    render: bool = False
    #: CSS selector a rendered page's DOM is taken after (it appears); None: when the network is idle.
    render_wait: str | None = None
    #: Resource types a rendered page may not fetch (Playwright's names: image, font, media,
    #: stylesheet, script, xhr, fetch, ...).
    render_block: tuple[str, ...] = ("image", "font", "media", "stylesheet")
    #: One cookie jar for the site, shared by every worker (in Redis): updated from every
    #: response's Set-Cookie, sent with every request. A ``login_url`` turns it on too.
    cookies: bool = False
    #: Where the fleet logs in, once, before the site's other requests: the page fetched here
    #: goes to ``login(page)``, which returns the Request that submits the login. Define
    #: ``logged_out(page) -> bool`` to have the fleet log in again (once) when a page says so.
    login_url: str | None = None
    #: Link rules (``Rule(allow=..., callback=..., follow=...)``), Scrapy's ``CrawlSpider.rules``: the first
    #: rule whose filters take a link wins; pages of ``parse`` and of following rules are followed (``rules``).
    rules: Sequence[Rule] = ()

    def process_item(self, item: Any, page: Page) -> Any:
        """Every item the callbacks yield, before the pipelines: return it (maybe changed, or another item)
        or raise ``DropItem(reason)`` not to store it. Any other exception fails the page. Default: the item."""
        return item

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
        """Requests seeded when no URL is given on the command line: the start URLs, then the sitemaps."""
        for url in self.start_urls:
            yield Request(url)
        yield from sitemap_requests(self)

    def callback(self, name: str) -> Callable[[Page], Iterable[Any]]:
        """The bound method a request names (with ``rules``, it and the rules: ``rules.with_rules``);
        raises AttributeError for an unknown one."""
        method = getattr(self, name, None)
        if not callable(method) or name.startswith("_"):
            raise AttributeError(f"spider {self.name!r} has no callback {name!r}")
        if self.rules:  # the callback's outputs, then the links its page's rules follow
            return with_rules(self, name, method, getattr(method, "__func__", None) is Spider.parse, Request)
        return method

    def domains(self) -> list[str]:
        """The allowed domains, defaulting to the hosts of the start URLs and sitemaps."""
        if self.allowed_domains:
            return [d.lower().lstrip(".") for d in self.allowed_domains]
        return sorted({(urlsplit(u).hostname or "").lower() for u in [*self.start_urls, *self.sitemap_urls]} - {""})


#: The callback name of sitemap downloads. Spider methods cannot be called so (a leading
#: "_" is refused), so it never shadows one.
SITEMAP_CALLBACK = "_sitemap"


def sitemap_requests(spider: Spider) -> Iterator[Request]:
    """The requests that start reading a spider's sitemaps (``Spider.start_requests`` yields them).

    Its ``sitemap_urls``, then, with ``sitemap_follow_robots``, the robots.txt of each origin
    of its start URLs and sitemaps (their ``Sitemap:`` lines are read). Re-read every
    ``sitemap_refresh`` seconds when the spider sets it. ConfigError for bad rules.
    """
    urls = list(getattr(spider, "sitemap_urls", []) or [])
    if urls or getattr(spider, "sitemap_follow_robots", False):
        SitemapRules(spider)  # a bad rule is a one-line error when seeding, not a failed job later
    if getattr(spider, "sitemap_follow_robots", False):
        origins = dict.fromkeys(_origin(url) for url in [*spider.start_urls, *urls])
        urls += [f"{origin}/robots.txt" for origin in origins if origin]
    refresh = getattr(spider, "sitemap_refresh", None)
    for url in dict.fromkeys(urls):
        yield Request(url, callback=SITEMAP_CALLBACK, refresh=refresh)


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""


class SitemapRules:
    """A spider's sitemap rules and follow patterns, compiled once; ConfigError naming a bad one."""

    def __init__(self, spider: Spider):
        rules = getattr(spider, "sitemap_rules", None) or [("", "parse")]
        follow = getattr(spider, "sitemap_follow", None) or [""]
        where = type(spider).__name__
        if isinstance(rules, str | bytes) or not all(isinstance(r, list | tuple) and len(r) == 2 for r in rules):
            raise ConfigError(f"{where}.sitemap_rules must be a list of (regex, callback name) pairs")
        for _, callback in rules:
            try:
                spider.callback(callback)
            except (AttributeError, TypeError):
                raise ConfigError(
                    f"{where}.sitemap_rules names {callback!r}, which is not a callback of the spider"
                ) from None
        if isinstance(follow, str | bytes):
            raise ConfigError(f"{where}.sitemap_follow must be a list of regexes")
        try:
            self.rules = [(re.compile(pattern), str(callback)) for pattern, callback in rules]
            self.follow = [re.compile(pattern) for pattern in follow]
        except (re.error, TypeError) as exc:
            raise ConfigError(f"{where}: a sitemap regex does not compile: {exc}") from None

    def callback(self, url: str) -> str | None:
        for pattern, callback in self.rules:
            if pattern.search(url):
                return callback
        return None

    def follows(self, url: str) -> bool:
        return any(pattern.search(url) for pattern in self.follow)
