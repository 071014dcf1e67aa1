"""Link rules (``Spider.rules``): which links of a page are followed, and to which callback.

Scrapy's ``CrawlSpider`` with ``Rule(LinkExtractor(...))``, flattened into one ``Rule``: a
rule extracts the links of a page that pass its filters (``allow``/``deny`` regexes searched
in the absolute URL, domains, ``restrict_css`` regions, tags and attributes, extensions,
link text), each once, in document order; a link an earlier rule extracted is skipped by
the later ones, so the first rule whose extractor matches a link wins. A rule's request
carries its index in ``meta["rule"]``, so its page goes to the rule's callback and, when the
rule follows, through the rules again (``with_rules``). Links outside the spider's allowed
domains are never extracted (the frontier would refuse them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Protocol

from selectolax.lexbor import LexborHTMLParser, LexborNode, SelectolaxError

from ..errors import ConfigError
from ..urls import host_allowed
from .extensions import link_extension, normal_extension

#: Regexes as a rule or ``Page.follow_all`` takes them: one (text or compiled), or several.
Patterns = str | re.Pattern[str] | Iterable[str | re.Pattern[str]]
#: What rules extract links from: HTML (or a response without a content type).
_HTML_TYPES = ("", "text/html", "application/xhtml+xml")
_SPACES = re.compile(r"[ \t\n\r\f]+")
#: Tag names a rule reads links from (``*``: any), and attribute names.
_TAG = re.compile(r"\*|[A-Za-z][\w-]*")
_ATTR = re.compile(r"[A-Za-z_][\w-]*")


class _Page(Protocol):
    """What rules read of a ``Page`` (this module cannot import spider.py, which imports it)."""

    url: str
    headers: Mapping[str, str]
    meta: dict[str, Any]

    def css(self, selector: str) -> list[LexborNode]: ...
    def urljoin(self, href: str) -> str: ...


class Link:
    """A link a rule extracted: its absolute ``url`` and its ``text`` (the text of everything in the
    link, spaces collapsed, ends stripped; read from the page when first asked for)."""

    __slots__ = ("url", "_node", "_text")

    def __init__(self, url: str, text: str | None = None, node: LexborNode | None = None):
        self.url = url
        self._text = text
        self._node = node

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = _SPACES.sub(" ", str(self._node.text(strip=False))).strip() if self._node else ""
            self._node = None
        return self._text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Link) and (self.url, self.text) == (other.url, other.text)

    def __hash__(self) -> int:
        return hash(self.url)

    def __repr__(self) -> str:
        return f"Link({self.url!r}, {self.text!r})"


@dataclass(frozen=True, eq=False)
class Rule:
    """Which links of a page to follow, and the callback of their pages: Scrapy's ``Rule`` with its
    ``LinkExtractor``'s arguments. Checked when the spider loads (``rules_problem``).

    A link is taken when one of ``allow`` (regexes searched in the absolute URL; none: any) and
    none of ``deny`` is found in it, its host is within ``allow_domains`` and not ``deny_domains``,
    its path ends in none of ``deny_extensions`` (None: only the spider's apply, as to every
    request) and its text matches one of ``restrict_text``; it is read from ``tags``' ``attrs``
    within ``restrict_css`` (the whole page by default). ``callback``/``errback``: spider methods
    or their names for the links' requests (None: no callback; the spider's errback). ``follow``:
    whether the links' pages go through the rules too (default: True without a callback, else
    False). ``meta``: JSON data handed to the links' pages (Scrapy's ``cb_kwargs``).
    ``process_links(links)`` -> the ``Link``s to follow; ``process_request(request, page)`` ->
    a request or None.
    """

    _: KW_ONLY
    allow: Patterns = ()
    deny: Patterns = ()
    allow_domains: str | Iterable[str] = ()
    deny_domains: str | Iterable[str] = ()
    restrict_css: str | Iterable[str] = ()
    restrict_text: Patterns = ()
    tags: str | Iterable[str] = ("a", "area")
    attrs: str | Iterable[str] = ("href",)
    deny_extensions: str | Iterable[str] | None = None
    callback: Callable[..., Any] | str | None = None
    errback: Callable[..., Any] | str | None = None
    follow: bool = None  # type: ignore[assignment]  # None until __post_init__ sets Scrapy's default
    meta: Mapping[str, Any] = field(default_factory=dict)
    process_links: Callable[..., Any] | str | None = None
    process_request: Callable[..., Any] | str | None = None

    def __post_init__(self) -> None:
        if self.follow is None:
            object.__setattr__(self, "follow", self.callback is None)


def patterns(value: Patterns | None) -> tuple[re.Pattern[str], ...]:
    """``value`` (a regex, compiled or not, or several) compiled; re.error or TypeError for a bad one."""
    if value is None:
        return ()
    several = [value] if isinstance(value, str | re.Pattern) else list(value)
    return tuple(one if isinstance(one, re.Pattern) else re.compile(one) for one in several)


def url_allowed(url: str, allow: tuple[re.Pattern[str], ...], deny: tuple[re.Pattern[str], ...]) -> bool:
    """Whether one of ``allow`` (any URL when empty) is found in ``url`` and none of ``deny``."""
    if allow and not any(pattern.search(url) for pattern in allow):
        return False
    return not any(pattern.search(url) for pattern in deny)


def _names(value: str | Iterable[str] | None) -> tuple[str, ...]:
    return () if value is None else (value,) if isinstance(value, str) else tuple(value)


def _method_name(cls: type, value: Any) -> str | None:
    """The spider method ``value`` names (a name, or the method or function itself); TypeError if none."""
    name = value if isinstance(value, str) else getattr(value, "__name__", None)
    if not callable(value) and not isinstance(value, str):
        raise TypeError(f"must be a spider method or its name, got {value!r:.80}")
    if not name or name.startswith("_") or not callable(getattr(cls, name, None)):
        raise TypeError(f"names {name or value!r}, which is not a method of {cls.__name__}")
    return str(name)


class _Extractor:
    """One rule compiled for one spider: its filters, callback name and hooks."""

    def __init__(self, cls: type, rule: Rule, index: int):
        where = f"[{index}]"
        if not isinstance(rule, Rule):
            raise ConfigError(f"{where} must be a Rule(...), got {rule!r:.80}")
        self.callback = self._method(cls, rule.callback, f"{where}.callback")
        self.errback = self._method(cls, rule.errback, f"{where}.errback")
        self.links_hook = self._method(cls, rule.process_links, f"{where}.process_links")
        self.request_hook = self._method(cls, rule.process_request, f"{where}.process_request")
        self.allow = self._patterns(rule.allow, f"{where}.allow")
        self.deny = self._patterns(rule.deny, f"{where}.deny")
        self.restrict_text = self._patterns(rule.restrict_text, f"{where}.restrict_text")
        self.allow_domains = self._domains(rule.allow_domains, f"{where}.allow_domains")
        self.deny_domains = self._domains(rule.deny_domains, f"{where}.deny_domains")
        self.regions = self._selectors(rule.restrict_css, f"{where}.restrict_css")
        tags, attrs = _names(rule.tags), _names(rule.attrs)
        named = all(isinstance(tag, str) and _TAG.fullmatch(tag) for tag in tags) and all(
            isinstance(attr, str) and _ATTR.fullmatch(attr) for attr in attrs
        )
        if not tags or not attrs or not named:
            raise ConfigError(f"{where}: tags and attrs must be names like 'a' and 'href', got {tags!r} and {attrs!r}")
        self.attrs = attrs
        self.selector = ", ".join(f"{tag}[{attr}]" for tag in tags for attr in attrs)
        denied = _names(rule.deny_extensions)
        self.denied = frozenset(normal_extension(str(extension)) for extension in denied) - {""}
        if not isinstance(rule.follow, bool):
            raise ConfigError(f"{where}.follow must be True, False or None, got {rule.follow!r}")
        self.follow = rule.follow
        try:
            self.meta = dict(json.loads(json.dumps(rule.meta)))
        except (TypeError, ValueError):
            raise ConfigError(f"{where}.meta must be a dict of JSON data, got {rule.meta!r:.80}") from None

    @staticmethod
    def _method(cls: type, value: Any, where: str) -> str | None:
        try:
            return None if value is None else _method_name(cls, value)
        except TypeError as exc:
            raise ConfigError(f"{where} {exc}") from None

    @staticmethod
    def _patterns(value: Any, where: str) -> tuple[re.Pattern[str], ...]:
        try:
            return patterns(value)
        except (re.error, TypeError) as exc:
            raise ConfigError(f"{where}: {value!r:.80} is not a regex: {exc}") from None

    @staticmethod
    def _domains(value: Any, where: str) -> tuple[str, ...]:
        domains = _names(value)
        if not all(isinstance(domain, str) and domain.strip() for domain in domains):
            raise ConfigError(f"{where} must be host names, got {value!r:.80}")
        return tuple(domain.strip().lower().lstrip(".") for domain in domains)

    @staticmethod
    def _selectors(value: Any, where: str) -> tuple[str, ...]:
        selectors = _names(value)
        try:
            for selector in selectors:
                LexborHTMLParser("<p></p>").css(selector)
        except (SelectolaxError, TypeError):
            raise ConfigError(f"{where}: {value!r:.80} is not a CSS selector") from None
        return selectors

    def extract(self, found: list[tuple[str, LexborNode]], skip: set[str]) -> Iterator[Link]:
        """The links of ``found`` (``_Scan``: the page's links where this rule reads them) it takes,
        each once, in order, but those in ``skip``."""
        taken: set[str] = set()
        for url, node in found:
            if url in taken or url in skip or not self.takes(url):
                continue
            link = Link(url, node=node)
            if self.restrict_text and not any(pattern.search(link.text) for pattern in self.restrict_text):
                continue
            taken.add(url)
            yield link

    def takes(self, url: str) -> bool:
        """Whether a link to ``url`` (within the spider's domains) passes this rule's filters of the URL."""
        if not url_allowed(url, self.allow, self.deny):
            return False
        if self.allow_domains and not host_allowed(url, self.allow_domains):
            return False
        if self.deny_domains and host_allowed(url, self.deny_domains):
            return False
        return not self.denied or link_extension(url, self.denied) is None


class _Scan:
    """One page's links, as rules read them: the page searched once for each way rules read it
    (regions, tags and attributes), each href joined once, links outside ``domains`` left out."""

    def __init__(self, page: _Page, domains: tuple[str, ...]):
        self.page = page
        self.domains = domains
        self.found: dict[tuple[tuple[str, ...], str, tuple[str, ...]], list[tuple[str, LexborNode]]] = {}
        self.hosts: dict[str, bool] = {}  # netloc -> within the domains

    def links(self, rule: _Extractor) -> list[tuple[str, LexborNode]]:
        """(absolute http(s) URL, node) of every link where ``rule`` reads them, in document order."""
        key = (rule.regions, rule.selector, rule.attrs)
        found = self.found.get(key)
        if found is None:
            found = self.found[key] = list(self._read(rule))
        return found

    def _read(self, rule: _Extractor) -> Iterator[tuple[str, LexborNode]]:
        page = self.page
        # lexbor's search within a node includes the node itself: a region may be the link
        regions = (node for region in rule.regions for node in page.css(region))
        nodes = (node for region in regions for node in region.css(rule.selector))
        for node in nodes if rule.regions else page.css(rule.selector):
            attributes = node.attributes
            for attr in rule.attrs:
                href = attributes.get(attr)
                if href and href.strip():
                    url = page.urljoin(href)
                    if url.startswith(("http://", "https://")) and self._within(url):
                        yield url, node

    def _within(self, url: str) -> bool:
        if not self.domains:
            return True
        netloc = url.split("/", 3)[2]
        within = self.hosts.get(netloc)
        if within is None:
            within = self.hosts[netloc] = host_allowed(url, self.domains)
        return within


class RuleSet:
    """Spider class ``cls``'s ``rules``, compiled once, links kept to ``domains`` (none: any host).

    ConfigError naming the first bad rule: ``[1].allow: ...`` (or ``must be a list ...``).
    """

    def __init__(self, cls: type, rules: Any, domains: Iterable[str] = ()):
        if isinstance(rules, str | bytes | Rule) or not isinstance(rules, Iterable):
            raise ConfigError(f"must be a list of Rule(...), got {rules!r:.80}")
        self.source = rules
        self.extractors = [_Extractor(cls, rule, index) for index, rule in enumerate(rules)]
        self.domains = tuple(domains)
        #: The callbacks the rules name.
        self.callbacks = frozenset(rule.callback for rule in self.extractors if rule.callback)

    def rule_of(self, page: _Page, callback: str) -> _Extractor | None:
        """The rule whose link led to ``page``, if its request names the rule and its callback still."""
        index = (getattr(page, "meta", None) or {}).get("rule")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.extractors):
            return None
        rule = self.extractors[index]
        return rule if (rule.callback or "parse") == callback else None

    def requests(self, spider: Any, page: _Page, make_request: Callable[..., Any]) -> Iterator[Any]:
        """The requests (made by ``make_request``, ``Request``) the rules make of ``page``'s links
        (none unless it is HTML)."""
        content_type = page.headers.get("content-type", "").partition(";")[0].strip().lower()
        if content_type not in _HTML_TYPES:
            return
        scan = _Scan(page, self.domains)
        seen: set[str] = set()
        for index, rule in enumerate(self.extractors):
            links: Iterable[Link] = rule.extract(scan.links(rule), seen)
            if rule.links_hook:
                links = list(getattr(spider, rule.links_hook)(list(links)) or ())
            meta = {**rule.meta, "rule": index}
            for link in links:
                seen.add(link.url)
                request = make_request(link.url, rule.callback, meta=dict(meta), errback=rule.errback)
                if rule.request_hook:
                    request = getattr(spider, rule.request_hook)(request, page)
                if request is not None:
                    yield request


def rule_set(spider: Any) -> RuleSet:
    """``spider``'s compiled rules, compiled on first use (again if its ``rules`` was replaced)."""
    compiled = spider.__dict__.get("_rule_set")
    if compiled is None or compiled.source is not spider.rules:
        try:
            compiled = RuleSet(type(spider), spider.rules, spider.domains())
        except ConfigError as exc:
            raise ConfigError(f"{type(spider).__name__}.rules{_separated(str(exc))}") from None
        spider.__dict__["_rule_set"] = compiled
    return compiled


def with_rules(
    spider: Any, name: str, method: Callable[[Any], Any], default: bool, make_request: Callable[..., Any]
) -> Callable[[Any], Iterable[Any]]:
    """Callback ``name`` (``method``) of a spider with rules: what it yields, then the rules' requests.

    A page a rule's link led to goes to the rule's callback (none: nothing), and through the
    rules when the rule follows. Any other page of the default callback (``parse``: start pages,
    requests naming no callback) goes to ``parse`` when the spider defines it (``default`` is
    False), else to ``parse_start_url`` if it has one, then always through the rules. A page of
    another callback, requested by the spider's own code, goes to it alone (as in Scrapy).
    """

    rules = rule_set(spider)
    if name != "parse" and name not in rules.callbacks:
        return method  # no rule leads to it: an errback, or a callback of the spider's own requests

    def run(page: Any) -> Iterator[Any]:
        rule = rules.rule_of(page, name)
        callback: Callable[[Any], Any] | None = method
        if rule is not None:
            follow = rule.follow
            callback = method if rule.callback else None
        else:
            follow = name == "parse"
            if follow and default:
                callback = getattr(spider, "parse_start_url", None)
        if callback is not None:
            yield from callback(page) or ()
        if follow:
            yield from rules.requests(spider, page, make_request)

    return run


def rules_problem(cls: type, value: Any) -> str | None:
    """What is wrong with spider class ``cls``'s ``rules`` (``value``), or None (``check_spider``):
    ``[1].allow: '(' is not a regex: ...``."""
    if not value:
        return None
    try:
        RuleSet(cls, value)
    except ConfigError as exc:
        return str(exc)
    return None


def _separated(problem: str) -> str:
    return problem if problem.startswith("[") else f" {problem}"
