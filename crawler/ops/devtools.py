"""One URL, one callback, no crawl: what ``crawler fetch``, ``crawler parse`` and ``crawler shell`` do.

``fetch_as_worker`` downloads a URL the way a download worker would (robots.txt, then
the site's gate, then the request a worker sends, through ``gated_fetch.send``);
``run_callback`` runs a spider callback on a page and sorts what it yields into items
(through ``process_item`` and the pipelines) and requests, as a parse worker would;
``route`` says where each request would go (queued, refused, already seen) without
queueing anything.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..coord.seen import contains
from ..coord.task import DownloadTask, check_priority, check_refresh, request_fingerprint
from ..errors import ConfigError, RefusedURL
from ..http.fetch import Response
from ..http.redirects import refresh_target
from ..spiders.items import Pipelines
from ..spiders.loading import SpiderSet
from ..spiders.spider import HTML_TYPES, Page, Request, Spider, accepts
from ..urls import as_written, canonicalize, host_allowed
from ..work.gated_fetch import page_headers, page_request, send
from ..work.jobs import browser
from ..work.jobs.context import site_context
from ..work.render import rendering
from ..work.runtime import Runtime

#: Where a request a callback yields would go.
QUEUED, REFUSED, SEEN = "queued", "refused", "already seen"


@dataclass
class Outputs:
    """What one callback yielded on one page: items (as stored, past ``process_item`` and the pipelines),
    requests, and why each dropped item was dropped, in order."""

    items: list[dict[str, Any]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    def links(self, callback: str | None = None) -> list[str]:
        """URLs of the requests (those for ``callback`` only, when given)."""
        return [r.url for r in self.requests if callback is None or r.callback == callback]


def run_callback(spider: Spider, page: Page, callback: str = "parse", pipelines: Pipelines | None = None) -> Outputs:
    """Run ``spider``'s ``callback`` on ``page``, its items through ``process_item`` and the pipelines.

    As a parse worker would: anything but items, ``Request`` objects and None is a
    TypeError; the callback's exceptions propagate, and a failing step as ItemError.
    Without ``pipelines``, the spider's are opened for this page and closed after it.
    """
    own = pipelines is None
    steps = Pipelines.open(spider) if pipelines is None else pipelines
    try:
        out = steps.sort(spider.callback(callback)(page), page, callback)
    finally:
        if own:
            steps.close()
    return Outputs([data for _, data in out.items], out.requests, out.dropped)


@dataclass(frozen=True)
class Routed:
    """Where one request would go: ``queued``, ``refused`` (with the reason) or ``already seen``."""

    url: str
    callback: str
    outcome: str
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "callback": self.callback, "outcome": self.outcome, "reason": self.reason}


def route(requests: Iterable[Request], domains: list[str], seen: Any = None) -> list[Routed]:
    """Where each request would go, as the frontier would decide, queueing nothing.

    ``seen(fingerprint) -> bool`` tells whether the site has seen a request (its seen set
    in Redis, ``request_fingerprint``); None: nothing seen yet. A request met twice in
    ``requests`` (URL, method and body) is seen the second time, as the frontier would see it.
    """
    routed = []
    here: set[bytes] = set()
    for request in requests:
        callback = str(request.callback)
        try:
            check_priority(request.priority)
            check_refresh(request.refresh)
            url = canonicalize(request.url)
        except (RefusedURL, ValueError) as exc:
            routed.append(Routed(request.url, callback, REFUSED, str(exc)))
            continue
        member = request_fingerprint(url, request.method, request.body)
        if not host_allowed(url, domains):
            routed.append(Routed(url, callback, REFUSED, f"outside the allowed domains ({', '.join(domains)})"))
        elif not request.dont_filter and (member in here or (seen is not None and seen(member))):
            routed.append(Routed(url, callback, SEEN))
        else:
            routed.append(Routed(url, callback, QUEUED))
        here.add(member)
    return routed


def seen_in(connection: Any, site: str) -> Any:
    """``seen(fingerprint)`` for ``route``: whether ``site``'s seen set in Redis has the request."""
    return lambda member: contains(connection, site, member)


def site_for(spiders: SpiderSet, url: str, named: str | None = None) -> str:
    """The site a URL belongs to: ``named`` if given (checked), else the one spider whose domains allow it."""
    if named is not None:
        spiders.get(named)
        return named
    try:
        canonical = canonicalize(url)
    except RefusedURL as exc:
        raise ConfigError(str(exc)) from None
    matches = sorted(name for name, cls in spiders.spiders.items() if host_allowed(canonical, cls().domains()))
    if not matches:
        raise ConfigError(f"no spider allows {canonical}: give --site NAME")
    if len(matches) > 1:
        raise ConfigError(f"{canonical} is allowed to several spiders ({', '.join(matches)}): give --site NAME")
    return matches[0]


def fetch_as_worker(rt: Runtime, site: str, url: str, meta: dict[str, Any] | None = None) -> Response:
    """Send ``url``'s request for ``site`` as a download worker would: robots.txt, then the site's gate
    (by address with ``gate_by = "ip"``), then the very request a worker sends (the spider's and
    site's headers, its cookies, its user agent, through its proxy: ``gated_fetch.send``), the caps.

    Rendered in the browser (its DOM returned) when the spider or ``meta`` (``render``,
    ``render_wait``, as ``Request`` carries them) says so, each request of the page
    through the gate as a worker's render sends it. Raises RefusedURL when the URL is off the
    site's domains or robots.txt disallows it, and the fetch's own errors (timeouts, connection,
    body too large), or the render's (BrowserNotFound). Nothing is recorded or queued, and the
    site's cookie jar is read, not changed.
    """
    context = site_context(rt, site)  # as a download reads it for its URL: the spider, the policy, the proxy
    spider = context.spider
    canonical = canonicalize(url)
    if not host_allowed(canonical, list(context.domains)):
        raise RefusedURL(f"{canonical} is outside the allowed domains of {site!r} ({', '.join(context.domains)})")
    task = DownloadTask(site, canonical, sent_url=as_written(url, canonical))  # sent as written, as a worker does
    if context.policy.obey_robots and not rt.robots.allowed(
        site,
        canonical,
        context.user_agent_for(task),
        functools.partial(rt.take_gate, site, canonical, context.policy),
        allow_private=spider.allow_private_addresses,
        proxy=context.proxy,
    ):
        raise RefusedURL(f"{canonical} is disallowed by robots.txt (the spider obeys it)")
    render, wait_for = rendering(spider, meta or {})
    if render:
        visit = browser.visit(rt, context, task)
        return rt.renderer.render(task.url_to_send, visit, wait_for, rt.settings.timeout, rt.settings.max_body_bytes)
    request = page_request(task, spider, page_headers(rt.connection, spider, task), context.proxy)
    return send(rt.fetcher, rt.take_gate(site, canonical, context.policy), request, proxies=rt.proxies)


def verdict(response: Response, content_types: Iterable[str] = HTML_TYPES, follow_meta_refresh: bool = True) -> str:
    """What a download worker does with ``response`` for a spider with ``content_types`` (and
    ``follow_meta_refresh``), in a few words."""
    status = response.status
    if 300 <= status < 400:
        where = response.location
        return f"redirect to {where}: a request of its own" if where else "redirect without Location: failed"
    if status == 429 or status >= 500:
        return "retried later with backoff"
    if status >= 400:
        return "recorded failed, not retried"
    if not accepts(content_types, response.content_type):
        skipped = "not HTML" if tuple(content_types) == HTML_TYPES else "not in content_types"
        return f"{skipped} ({response.content_type}): recorded skipped, no callback"
    if follow_meta_refresh and (target := refresh_target(response)) is not None:
        return f"meta refresh to {target}: a request of its own, no callback"
    return "handed to the callback"


def page_of(
    response: Response,
    meta: dict[str, Any] | None = None,
    content_types: Iterable[str] = HTML_TYPES,
    follow_meta_refresh: bool = True,
) -> Page:
    """The ``Page`` a parse worker would build from ``response`` for a spider with ``content_types``
    (and ``follow_meta_refresh``).

    Raises ConfigError when a worker would not hand the response to a callback.
    """
    unparsed = not (200 <= response.status < 300) or not accepts(content_types, response.content_type)
    if unparsed or (follow_meta_refresh and refresh_target(response) is not None):
        why = verdict(response, content_types, follow_meta_refresh)
        raise ConfigError(f"HTTP {response.status} {response.url}: {why}")
    return Page(
        response.url,
        response.body,
        status=response.status,
        headers=response.headers,
        meta=meta or {},
        encoding=response.encoding,
    )


def parse_meta(text: str | None) -> dict[str, Any]:
    """``--meta``: a JSON object, or ConfigError saying what is wrong."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--meta is not valid JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"--meta must be a JSON object, got {type(value).__name__}")
    return value


def summary_lines(outputs: Outputs, routed: list[Routed]) -> Iterator[str]:
    """``crawler parse``'s report: the items as JSON lines, then each request and where it would go."""
    yield f"{len(outputs.items)} item{'' if len(outputs.items) == 1 else 's'}"
    for item in outputs.items:
        yield json.dumps(item, ensure_ascii=False, default=str)
    if outputs.dropped:
        yield f"{len(outputs.dropped)} item{'' if len(outputs.dropped) == 1 else 's'} dropped"
        for reason in outputs.dropped:
            yield f"  dropped: {reason}"
    yield f"{len(routed)} request{'' if len(routed) == 1 else 's'}"
    width = max((len(r.callback) for r in routed), default=0)
    for r in routed:
        reason = f"  ({r.reason})" if r.reason else ""
        yield f"  {r.outcome:<12}  {r.callback:<{width}}  {r.url}{reason}"
