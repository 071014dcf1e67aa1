"""One request to a site as a worker sends it: its headers, and its send through the site's gate (``send``).

Every request the crawler makes to a site goes through ``send``: a page's, a login's, robots.txt,
the browser's routed requests for a rendered page, and ``crawler fetch``/``shell``'s. The gate
is taken by the caller (how long it may wait is the caller's); ``send`` checks the gate right
before the first byte, rearms it once the request is on the wire, lets this process's turn go
once the request is over, and then keeps the answer's cookies and tells the site's pace.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from redis import Redis

from ..coord.gate import Gate
from ..coord.session import Jar, uses_cookies
from ..coord.task import DownloadTask
from ..errors import PermanentError, ProxyError, TransientError
from ..http.fetch import Fetcher, Response
from ..http.headers import merge_headers
from ..http.proxies import ProxyPool
from ..http.redirects import withheld

log = logging.getLogger("crawler.jobs")

#: What is told how a request went (``send``): its gate, its answer or None, the error or None.
Observe = Callable[[Gate, Response | None, Exception | None], None]


@dataclasses.dataclass(frozen=True)
class Outgoing:
    """One request to ``site`` as it goes on the wire: ``headers`` beyond the fetcher's own (User-Agent,
    Accept, Accept-Encoding, which these override), cookies included; ``user_agent`` the spider's (None:
    the fetcher's); ``proxy`` the proxy it goes through (None: direct); ``allow_private`` the spider's
    ``allow_private_addresses``."""

    site: str
    url: str
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    user_agent: str | None = None
    proxy: str | None = None
    allow_private: bool = False
    method: str = "GET"
    body: bytes | None = None


def sent_headers(spider: Any, task: DownloadTask) -> dict[str, str]:
    """The headers a task's request is sent with, beyond the fetcher's own: the spider's ``headers``
    under the request's own (a name in both, in any case, is the request's), without the
    credentials a redirect to another origin withheld (``redirects.withheld``)."""
    return withheld(merge_headers(getattr(spider, "headers", None) or {}, task.headers))


def page_headers(
    connection: Redis, spider: Any, task: DownloadTask, conditional: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The headers a page's request is sent with: ``sent_headers``, a refresh's ``conditional`` ones,
    and, for a spider with cookies (``uses_cookies``), the site's cookies for its URL (one read of the jar)."""
    headers = {**sent_headers(spider, task), **(conditional or {})}
    if uses_cookies(spider):
        headers = {**headers, **Jar(connection, task.site).header(task.url)}
    return headers


def page_request(task: DownloadTask, spider: Any, headers: Mapping[str, str], proxy: str | None) -> Outgoing:
    """The request for ``task``'s page with ``headers`` (``page_headers``), through ``proxy``."""
    return Outgoing(
        task.site, task.url, headers, spider.user_agent, proxy, spider.allow_private_addresses, task.method, task.body
    )


def send(
    fetcher: Fetcher,
    gate: Gate,
    request: Outgoing,
    *,
    on_sent: Callable[[], Any] | None = None,
    jar: Jar | None = None,
    observe: Observe | None = None,
    proxies: ProxyPool | None = None,
    truncate_at: int | None = None,
    max_bytes: int | None = None,
    sink: Callable[[bytes], Any] | None = None,
    timeout: float | None = None,
) -> Response:
    """Send ``request`` through ``gate``, taken by the caller, and let this process's turn at it go
    (``Gate.let_go``) once the request is over, whatever came of it.

    Right before the request's first byte the gate is made sure of (``Gate.before_send``);
    once it is written, ``on_sent()`` runs: by default the gate is rearmed (``rearm``). Then
    the answer's cookies go into ``jar`` (if given) and ``observe`` (if given) is told how the
    request went, an answer or an error (a TransientError or PermanentError); a proxy that failed
    (ProxyError) is benched in ``proxies``. ``truncate_at``, ``max_bytes``, ``sink`` and ``timeout``
    are the fetcher's (``Fetcher.get``). Raises what ``Fetcher.get`` raises.
    """
    try:
        try:
            response = fetcher.get(
                request.url,
                user_agent=request.user_agent,
                on_sent=on_sent if on_sent is not None else functools.partial(rearm, gate, request.site, request.url),
                before_send=gate.before_send,
                headers=request.headers,
                method=request.method,
                body=request.body,
                allow_private=request.allow_private,
                proxy=request.proxy,
                truncate_at=truncate_at,
                max_bytes=max_bytes,
                sink=sink,
                timeout=timeout,
            )
        finally:
            gate.let_go()  # sent (passed on already, at the rearm) or not: another thread's turn at the gate
    except (TransientError, PermanentError) as exc:
        if observe is not None:
            observe(gate, None, exc)
        if isinstance(exc, ProxyError) and request.proxy is not None and proxies is not None:
            proxies.bench(request.proxy, str(exc))
        raise
    if jar is not None:
        jar.update(request.url, response.set_cookies)
    if observe is not None:
        observe(gate, response, None)
    return response


def rearm(gate: Gate, site: str, url: str) -> None:
    """Start ``site``'s interval now that the request for ``url`` is on the wire; warn if the gate was lost."""
    if not gate.rearm():
        # Taking the gate and sending took longer than its send grace (a slow connect, a
        # paused process): another worker may have taken it, so this gap may be short.
        log.warning(
            "%s: request sent after the gate's send grace had run out; spacing may be short: %s",
            site,
            url,
        )
