"""One request to a site as a worker sends it: its headers, and its send through the site's gate (``send``).

Every request the crawler makes to a site goes through ``send``: a page's, a login's, robots.txt,
the browser's routed requests for a rendered page, and ``crawler fetch``/``shell``'s. The gate
is taken by the caller (how long it may wait is the caller's); ``send`` runs the spider's
``before_send`` hook on a request that carries it (``Outgoing.spider_hook``: a page's, a login's),
checks the gate right before the first byte (``Gate.before_send``, the send grace: not the
spider's hook), rearms it once the request is on the wire, lets this process's turn go once the
request is over, and then keeps the answer's cookies and tells the site's pace.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from redis import Redis

from ..coord.gate import Gate
from ..coord.session import Jar, uses_cookies
from ..coord.task import DownloadTask
from ..errors import BeforeSendFailed, FetchTimeout, PermanentError, ProxyError, RefusedURL, TransientError
from ..http.fetch import Fetcher, Response
from ..http.headers import merge_headers
from ..http.proxies import ProxyPool
from ..http.redirects import withheld
from ..spiders.items import failure_text
from ..urls import canonicalize

log = logging.getLogger("crawler.jobs")

#: What is told how a request went (``send``): its gate, its answer or None, the error or None.
Observe = Callable[[Gate, Response | None, Exception | None], None]

#: What a request is, as the spider's ``before_send`` sees it (``Sending.kind``): a page's (a crawl's,
#: ``crawler fetch``'s and ``shell``'s), or one of a login's two (the login page, the login request).
PAGE, LOGIN = "page", "login"


@dataclasses.dataclass(frozen=True)
class SpiderHook:
    """The spider's ``before_send`` for one request (``spider_hook``): ``call``, and what the request
    is (``kind``) and carries (``meta``, the ``Request``'s), which the hook is told."""

    call: Callable[[Sending], Any]
    kind: str = PAGE
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def spider_hook(spider: Any, kind: str = PAGE, meta: Mapping[str, Any] | None = None) -> SpiderHook | None:
    """The spider's ``before_send`` hook for a request of ``kind`` (None: the spider has none). Looked
    up on the instance, so any spider class may define it; docs/SPIDERS.md, "Signing a request"."""
    call = getattr(spider, "before_send", None)
    return SpiderHook(call, kind, dict(meta or {})) if callable(call) else None


class Headers(MutableMapping[str, str]):
    """Request headers whose names are compared without case: setting ``X-Sig`` replaces ``x-sig``;
    a name is sent as it was last written."""

    def __init__(self, headers: Mapping[str, str]):
        self._items: dict[str, tuple[str, str]] = {}
        for name, value in headers.items():
            self[name] = value

    def __getitem__(self, name: str) -> str:
        return self._items[name.lower()][1]

    def __setitem__(self, name: str, value: str) -> None:
        self._items[name.lower()] = (name, value)

    def __delitem__(self, name: str) -> None:
        del self._items[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Headers({dict(self.items())!r})"


@dataclasses.dataclass(eq=False)
class Sending:
    """The request the spider's ``before_send(request)`` is given, after the site's gate is taken and
    before its first byte is sent: ``method``, ``url``, ``headers`` (the spider's, the request's, the
    jar's ``Cookie``: a ``Headers``) and ``body`` may be changed in place; ``site``, ``kind`` (``PAGE``
    or ``LOGIN``) and ``meta`` (the request's, a copy) are for reading. ``cookies``: the site's cookies
    that go with it (its ``Cookie`` header, read from the jar already: no other read)."""

    site: str
    kind: str
    method: str
    url: str
    headers: Headers
    body: bytes | None
    meta: Mapping[str, Any]

    @property
    def cookies(self) -> dict[str, str]:
        """The cookies sent with the request, by name (a cookie without a name under "")."""
        pairs = (part.partition("=") for part in self.headers.get("cookie", "").split("; ") if part)
        return {name if equals else "": value if equals else name for name, equals, value in pairs}


@dataclasses.dataclass(frozen=True)
class Outgoing:
    """One request to ``site`` as it goes on the wire: ``headers`` beyond the fetcher's own (User-Agent,
    Accept, Accept-Encoding, which these override), cookies included; ``user_agent`` the spider's (None:
    the fetcher's); ``proxy`` the proxy it goes through (None: direct); ``allow_private`` the spider's
    ``allow_private_addresses``; ``spider_hook`` the spider's ``before_send``, run by ``send`` (None: none)."""

    site: str
    url: str
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    user_agent: str | None = None
    proxy: str | None = None
    allow_private: bool = False
    method: str = "GET"
    body: bytes | None = None
    spider_hook: SpiderHook | None = None


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
    """The request for ``task``'s page with ``headers`` (``page_headers``), through ``proxy``, with the
    spider's ``before_send`` (``spider_hook``)."""
    return Outgoing(
        task.site,
        task.url_to_send,
        headers,
        spider.user_agent,
        proxy,
        spider.allow_private_addresses,
        task.method,
        task.body,
        spider_hook(spider, PAGE, task.meta),
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

    First the spider's ``before_send`` runs on it (``prepared_at_gate``: its time counts against ``timeout``).
    Right before the first byte the gate is made sure of (``Gate.before_send``: taken again if the
    send grace ran out meanwhile); once it is written, ``on_sent()`` runs: by default the gate is
    rearmed (``rearm``). Then the answer's cookies go into ``jar`` (if given) and ``observe`` (if
    given) is told how the request went, an answer or an error (a TransientError or PermanentError);
    a proxy that failed (ProxyError) is benched in ``proxies``. ``truncate_at``, ``max_bytes``,
    ``sink`` and ``timeout`` are the fetcher's (``Fetcher.get``). Raises what it and ``prepared`` raise.
    """
    try:
        request, timeout = prepared_at_gate(fetcher, gate, request, timeout)
    except BaseException:
        gate.let_go()  # nothing sent; the site is told nothing either: the spider's doing, not the site's
        raise
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


def prepared_at_gate(
    fetcher: Fetcher, gate: Gate, request: Outgoing, timeout: float | None
) -> tuple[Outgoing, float | None]:
    """``prepared``, run once more after ``gate`` is taken again when the hook outlasted its send
    grace, so that what the hook wrote (a signature's timestamp) is of the send, not of before the wait."""
    hooked, left = prepared(fetcher, request, timeout)
    if request.spider_hook is None or not gate.lapsed():
        return hooked, left
    gate.before_send()
    return prepared(fetcher, request, left)


def prepared(fetcher: Fetcher, request: Outgoing, timeout: float | None) -> tuple[Outgoing, float | None]:
    """``request`` as its spider's ``before_send`` leaves it (``Sending``), and what is left after it ran
    of the request's ``timeout`` (the fetcher's when None, as in ``Fetcher.get``); ``request`` and
    ``timeout`` as they are for a request without the hook.

    Raises BeforeSendFailed, its message holding the traceback, when the hook raises, returns
    anything but None (it changes the request in place) or leaves a method or body of the wrong
    type; RefusedURL when it moved the request to another origin (``same_origin``); FetchTimeout
    when it took the whole timeout.
    """
    hook = request.spider_hook
    if hook is None:
        return request, timeout
    began = time.monotonic()
    limit = fetcher.timeout if timeout is None else min(timeout, fetcher.timeout)
    sending = Sending(
        request.site, hook.kind, request.method, request.url, Headers(request.headers), request.body, dict(hook.meta)
    )
    try:
        returned = hook.call(sending)
    except Exception as exc:  # any: the spider's code fails its request, never the job
        raise BeforeSendFailed(f"before_send raised: {failure_text(exc)}") from exc
    if returned is not None:
        raise BeforeSendFailed(f"before_send must change the request in place and return None, got {returned!r:.80}")
    if not isinstance(sending.method, str) or not isinstance(sending.body, bytes | None):
        raise BeforeSendFailed(f"before_send left a method {sending.method!r:.40} or a body not bytes nor None")
    left = limit - (time.monotonic() - began)
    if left <= 0:
        raise FetchTimeout(f"before_send took {time.monotonic() - began:.1f}s, the request's whole {limit:g}s")
    url = same_origin(request.url, sending.url)
    return dataclasses.replace(
        request, url=url, method=sending.method, headers=dict(sending.headers), body=sending.body
    ), left


def same_origin(url: str, changed: str) -> str:
    """``changed``, the URL a ``before_send`` hook left of ``url``, if it is of the same origin (scheme, host,
    port): the site's gate was taken, and its allowed domains and address rules checked, for that
    one. RefusedURL otherwise, or when it is no http(s) URL. Sent as written, not canonicalized."""
    if changed == url:
        return url
    if not isinstance(changed, str):
        raise RefusedURL(f"before_send set the URL to {changed!r:.80}, not a string")
    try:
        before, after = urlsplit(canonicalize(url)), urlsplit(canonicalize(changed))
    except (RefusedURL, ValueError) as exc:
        raise RefusedURL(f"before_send set an unusable URL: {exc}") from None
    origins = [(parts.scheme, parts.hostname, parts.port) for parts in (before, after)]
    if origins[0] != origins[1]:
        was, now = (f"{scheme}://{host}" + (f":{port}" if port else "") for scheme, host, port in origins)
        raise RefusedURL(
            f"before_send moved the request from {was} to another origin, {now}: "
            "only its path and query may change (the gate was taken for the first)"
        )
    return changed


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
