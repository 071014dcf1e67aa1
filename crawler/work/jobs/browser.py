"""The browser's requests for a rendered page: each through the site's gate, sent as a download sends one."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from ...coord.session import Jar
from ...coord.task import DownloadTask
from ...errors import CrawlerError, FetchTimeout
from ...http.fetch import Response
from ...store.database import FAILED, OK
from .. import runtime
from ..gated_fetch import Outgoing, send
from ..render_requests import DEFAULT_BLOCK, Visit
from .context import SiteContext

#: Records a request the rendered page made (``AttemptState.record``'s signature).
Record = Callable[..., None]


def visit(rt: runtime.Runtime, context: SiteContext, task: DownloadTask, record: Record | None = None) -> Visit:
    """What the render of ``task``'s page may fetch, and how (``render.Visit``): each request through
    the site's gate and the context's proxy (``routed_fetch``), within the site's domains, with its user agent,
    in the site's own browser context.
    ``record``: what records each of the page's requests but its own (None: nothing recorded)."""
    return Visit(
        fetch=routed_fetch(rt, context, task, record),
        domains=list(context.domains),
        block=frozenset(getattr(context.spider, "render_block", DEFAULT_BLOCK)),
        user_agent=context.user_agent,
        site=task.site,
    )


def routed_fetch(
    rt: runtime.Runtime, context: SiteContext, task: DownloadTask, record: Record | None
) -> Callable[[str, Mapping[str, str], float, bool], Response]:
    """``Visit.fetch`` for the render of ``task``'s page: each request through the site's gate, sent by
    ``gated_fetch.send`` as a page is, with the site's headers and, for a site with cookies, its jar
    (updated from each answer); ``record``ed, but the page's own (``Attempt.conclude`` records that)."""
    spider, proxy = context.spider, context.proxy
    site_headers = dict(getattr(spider, "headers", None) or {})
    jar = Jar(rt.connection, task.site) if context.uses_cookies else None

    def fetch(url: str, headers: Mapping[str, str], wait: float, is_page: bool) -> Response:
        deadline = time.monotonic() + wait  # the gate's wait and the request share it
        gate = rt.take_gate_within(task.site, url, wait, policy=context.policy)
        if gate is None:
            raise FetchTimeout(f"the site's gate stayed closed until the render's deadline: {url}")
        cookies = jar.header(url) if jar is not None else {}
        request = Outgoing(
            task.site,
            url,
            {**site_headers, **headers, **cookies},
            spider.user_agent,
            proxy,
            spider.allow_private_addresses,
        )
        try:
            response = send(rt.fetcher, gate, request, jar=jar, proxies=rt.proxies, timeout=deadline - time.monotonic())
        except CrawlerError as exc:
            if record is not None and not is_page:
                record(FAILED, url=url, error=f"requested by the rendered page {task.url}: {exc}")
            raise
        if record is not None and not is_page:
            record(OK if response.status < 400 else FAILED, url=url, response=response)
        return response

    return fetch
