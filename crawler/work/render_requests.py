"""The requests of a page being rendered: what it may fetch (``Visit``), each checked, fetched or aborted.

Each request the browser makes is checked, fetched through the ``Visit`` (the site's gate, the
crawler's fetcher) and handed to the browser, or aborted. Playwright is the caller's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin

from ..errors import CrawlerError, FetchTimeout, RefusedURL
from ..http.fetch import Response
from ..urls import check_url

log = logging.getLogger("crawler.render")

#: Resource types (Playwright's names) aborted unless a spider says otherwise (``Spider.render_block``).
DEFAULT_BLOCK = ("image", "font", "media", "stylesheet")
#: Redirect hops of one script or XHR followed inside a render.
MAX_SUBRESOURCE_REDIRECTS = 5
#: Request headers of the browser not passed on to the fetcher (it sets its own, or they are per connection).
DROPPED_REQUEST_HEADERS = frozenset({"accept-encoding", "user-agent", "host", "connection", "content-length"})
#: Response headers not handed to the browser: the body it gets is decoded and whole.
DROPPED_RESPONSE_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding", "connection"})


@dataclass
class Visit:
    """What one render may fetch, and how.

    ``fetch(url, headers, wait, is_page)`` fetches one request the page makes (through the
    site's gate, leaving a fetch record for the page's requests but not for the page itself,
    whose record is the download job's) and returns the response, or raises a
    ``CrawlerError``, within ``wait`` seconds, the gate's wait and the request together:
    what is left of the render's deadline. ``domains``: requests elsewhere are
    aborted; ``block``: resource types aborted.
    """

    fetch: Callable[[str, Mapping[str, str], float, bool], Response]
    domains: list[str]
    block: frozenset[str] = frozenset(DEFAULT_BLOCK)
    user_agent: str | None = None
    #: The site rendered: its browser context and pages serve its renders only; None: a context of its own.
    site: str | None = None
    #: What the page asked for and was not let fetch: (resource type, URL, why); for ``crawler fetch --render``.
    aborted: list[tuple[str, str, str]] = field(default_factory=list)


class Navigation:
    """What the page's own request came to, read after ``goto``."""

    def __init__(self) -> None:
        #: The page's response when it is not to be rendered (a redirect, an error status, not HTML).
        self.unrendered: Response | None = None
        #: Why the page's own request failed.
        self.error: CrawlerError | None = None
        self.response: Response | None = None


@dataclass
class Job:
    """One render's share of a tab: what it may fetch, by when, and what its page's own request came to."""

    visit: Visit
    deadline: float
    navigation: Navigation
    #: Routed fetches not done yet.
    pending: set[asyncio.Future[Response]] = field(default_factory=set)


async def answer(answering: Any) -> None:
    """Await ``answering`` (a route's ``abort`` or ``fulfill``): the page may be gone (its deadline)."""
    try:
        await answering
    except Exception as exc:  # any: nothing to answer, and the render says why
        log.debug("request not answered: %s", exc)


async def route(route: Any, page: Any, job: Job, fetchers: concurrent.futures.Executor) -> None:
    """Fetch one request of the page through ``job.visit`` (in a thread of the renderer's, the event
    loop free meanwhile) and hand the browser the answer, or abort it."""
    request = route.request
    visit, navigation, deadline = job.visit, job.navigation, job.deadline
    try:
        is_page = request.is_navigation_request() and request.frame == page.main_frame
        why = refusal(request, visit, is_page and navigation.response is None)
        if why is None and is_page and navigation.response is not None:
            why = "a second navigation of the page"  # script-driven: one render is one page
        if why is None and time.monotonic() >= deadline:
            why = "past the render's deadline"
        if why is not None:
            visit.aborted.append((request.resource_type, request.url, why))
            await route.abort("blockedbyclient")
            return
        headers = {k: v for k, v in request.headers.items() if k.lower() not in DROPPED_REQUEST_HEADERS}
        try:
            fetching = asyncio.get_running_loop().run_in_executor(
                fetchers, functools.partial(fetch_following, request.url, headers, visit, deadline, is_page)
            )
            job.pending.add(fetching)
            try:
                response = await fetching
            finally:
                job.pending.discard(fetching)
        except CrawlerError as exc:
            if is_page:
                navigation.error = exc
            await route.abort("failed")
            return
        if is_page:
            navigation.response = response
            if not 200 <= response.status < 300 or not response.is_html:
                navigation.unrendered = response
                await route.abort("aborted")
                return
        kept = {k: v for k, v in response.headers.items() if k not in DROPPED_RESPONSE_HEADERS}
        await route.fulfill(status=response.status, headers=kept, body=response.body)
    except Exception as exc:  # the page may be gone (deadline): nothing to answer, and the render says why
        log.debug("request %s not answered: %s", request.url, exc)


def refusal(request: Any, visit: Visit, is_page: bool) -> str | None:
    """Why ``request`` is not to be fetched, or None."""
    if not is_page and request.resource_type in visit.block:
        return f"{request.resource_type} blocked"
    if request.method != "GET":
        return f"{request.method} not sent"
    try:
        check_url(request.url, visit.domains)
    except RefusedURL as exc:
        return str(exc)
    return None


def fetch_following(url: str, headers: Mapping[str, str], visit: Visit, deadline: float, is_page: bool) -> Response:
    """``visit.fetch``, following a script's or XHR's redirects (each hop checked); the page's own are not."""
    response = visit.fetch(url, headers, time_left(deadline, url), is_page)
    hops = 0
    while not is_page and 300 <= response.status < 400 and response.location:
        hops += 1
        target = urljoin(url, response.location.strip())
        if hops > MAX_SUBRESOURCE_REDIRECTS:
            raise RefusedURL(f"more than {MAX_SUBRESOURCE_REDIRECTS} redirects from {url}")
        check_url(target, visit.domains)
        url, response = target, visit.fetch(target, headers, time_left(deadline, target), False)
    return response


def time_left(deadline: float, url: str) -> float:
    """Seconds left before the render's ``deadline`` for requesting ``url``; FetchTimeout when none are."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise FetchTimeout(f"the render's deadline passed before {url} was requested")
    return left
