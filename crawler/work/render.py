"""Rendering pages in a headless Chromium (Playwright), for sites whose content JavaScript writes.

One browser per process, started on the first rendered page only and restarted if it
dies, rendering up to ``RENDER_PAGES`` pages at once. Each site has a browser context of its
own (``Visit.site``), kept with its pages for its later renders, so no cookie, storage or
cache passes from one site to another; a page is reused, its document stopped and emptied,
by its own site's renders only (``RENDERS_PER_PAGE`` of them). Every request the page makes
goes through ``Visit.fetch`` or is aborted: the browser itself never opens a connection.
Requests of a blocked resource type (images, fonts, media, stylesheets by default), other
than GET, outside the allowed domains, and websockets are aborted; the rest are fetched by
the crawler's own fetcher (its address rules, body cap and proxies) through the site's
gate, and handed to the browser (``route.fulfill``). A redirect of the page itself ends the
render: the download job sends its target through the frontier, as for a plain fetch; a
script's or an XHR's redirect is followed here, each hop checked and fetched the same way.

Two bounds hold whatever the page does:

- **Time.** A render has one deadline, ``timeout`` seconds, that its context, navigation,
  waits and routed fetches share: each fetch (gate wait included) gets only what is left of
  it. The steps that take no timeout (reading the DOM, closing a page), which a script
  that never yields holds forever, are cut by a watchdog that kills the browser
  ``RENDER_GRACE`` seconds past the deadline; the page is a FetchTimeout either way.
- **Network.** No byte leaves the browser but through ``route`` and the fetcher: it is
  launched (``chromium.confinement``) with every connection of its own sent to a proxy at a local
  port that refuses it, loopback included (a dedicated, shared or service worker's
  WebSocket or fetch, which ``route`` does not see, WebRTC's TURN over TCP), WebRTC kept
  off UDP outside a proxy (STUN), and no host name resolved. Page WebSockets are answered
  by ``route_web_socket`` and never connected.

The browser is driven by Playwright's async API in an event loop of its own thread
(``Renderer``): the download threads of a process hand it their pages
(``run_coroutine_threadsafe``) and wait for their DOM; the routed fetches, which block on
the site's gate, run in threads of the renderer's, the event loop serving the other pages
meanwhile.
Playwright is an optional dependency (``pip install -e '.[browser]'``): imported when the
first page is rendered.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import json
import logging
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ..errors import BodyTooLarge, FetchTimeout, TransientError
from ..http.fetch import Response
from .chromium import SPEED_SWITCHES, BrowserNotFound, KillTimer, browser_pid, confinement, find_browser
from .render_requests import Job, Navigation, Visit, answer, route

log = logging.getLogger("crawler.render")

#: Seconds a render may run past its deadline before its browser is killed (a render ends within
#: ``timeout`` plus about this much): reading the DOM and closing a page take no timeout.
RENDER_GRACE = 1.0
#: Pages rendered at once by one process (its download threads beyond that wait their turn).
RENDER_PAGES = 4
#: Routed fetches at once per page (threads of the renderer's: each blocks on the site's gate).
FETCHES_PER_PAGE = 4
#: Renders a page serves before it is closed for a new one.
RENDERS_PER_PAGE = 100
#: Renders of a page between two garbage collections its renderer is asked for: V8 collects the
#: documents a reused page left behind late, if ever, with no memory pressure (hundreds of MiB).
COLLECT_EVERY = 5
#: Sites whose browser context (and idle pages) a process keeps; the least recently rendered go first.
KEPT_SITES = 8


class RenderFailed(TransientError):
    """The browser failed or died during a render (it is restarted for the next page)."""


#: What a page's document is left as between two renders of its site: stopped (its loads, timers and
#: animation frames) and emptied: cheaper than a navigation to ``about:blank`` (docs/BENCHMARKS.md).
QUIETEN = """() => {
  window.stop();
  const timer = setTimeout(() => {}, 0), frame = requestAnimationFrame(() => {});
  for (let i = 0; i <= timer; i++) { clearTimeout(i); clearInterval(i); }
  for (let i = 0; i <= frame; i++) cancelAnimationFrame(i);
  document.documentElement.remove();
}"""


#: Resolves once an element matches a CSS selector (``%s``, a JSON string), as Playwright's
#: ``wait_for_selector(state="attached")`` does for CSS.
WAIT_FOR_SELECTOR = """new Promise(resolve => {
  const selector = %s, found = () => document.querySelector(selector) !== null;
  if (found()) return resolve(true);
  const observer = new MutationObserver(() => { if (found()) { observer.disconnect(); resolve(true); } });
  observer.observe(document, {childList: true, subtree: true, attributes: true});
})"""
#: The document as HTML, its doctype first.
DOCUMENT_HTML = """(document.doctype ? new XMLSerializer().serializeToString(document.doctype) : "")
  + (document.documentElement ? document.documentElement.outerHTML : "")"""


class _Tab:
    """A page of a site's context, reused by one render after another; ``job`` is the render it
    serves now (None between two: whatever the page asks for then is aborted)."""

    def __init__(self, page: Any):
        self.page = page
        self.job: Job | None = None
        self.renders = 0
        self.devtools: Any = None  # the page's CDP session: its DOM read, its renderer asked for a GC


class _Site:
    """A browser context of one site (and user agent), its idle tabs, and how many renders use it."""

    def __init__(self, context: Any):
        self.context = context
        self.idle: list[_Tab] = []
        self.busy = 0


class Renderer:
    """One headless Chromium for this process, driven by Playwright's async API in a thread of its own.

    ``render`` may be called from any thread: up to ``pages`` renders run at once (the callers
    beyond wait their turn), each in a page of its own in its site's browser context. A
    site's context (``Visit.site``) and its pages are reused by its later renders, never by
    another site's; a render without a site gets a fresh context, closed after it.
    ``launches`` counts the browsers started (a crash makes another).
    """

    def __init__(self, browser_path: str | None = None, pages: int = RENDER_PAGES):
        self.browser_path = browser_path
        self.pages = pages
        self.launches = 0
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._reset()

    def _reset(self) -> None:
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots = threading.BoundedSemaphore(self.pages)
        #: The routed fetches block (the gate's wait, the request): they run here, not in the event loop.
        self._fetchers = concurrent.futures.ThreadPoolExecutor(1)
        # The event loop's own, touched in its thread only.
        self._playwright: Any = None
        self._browser: Any = None
        self._browser_pid: int | None = None
        self._launching: asyncio.Lock | None = None
        self._opening: asyncio.Lock | None = None
        self._sites: OrderedDict[tuple[str, str | None], _Site] = OrderedDict()
        #: A local port bound and never listened on: the browser's proxy, which refuses every connection.
        self._refuser: socket.socket | None = None

    def render(self, url: str, visit: Visit, wait_for: str | None, timeout: float, max_bytes: int) -> Response:
        """Load ``url`` in a page of its site's context and return its DOM as an HTML ``Response`` (utf-8).

        The DOM is taken once ``wait_for`` (a CSS selector) is in it, or, without one, once
        the network has been idle for 500 ms after the load event (or at the deadline, if it
        never is). The render ends within ``timeout`` seconds (plus ``RENDER_GRACE`` at most) of
        its start (its turn among ``pages``, the browser started), a FetchTimeout when it is not
        done by then; a DOM over ``max_bytes`` (utf-8) is BodyTooLarge. A page whose own response
        is a redirect, an error status or not HTML is returned unrendered, as fetched.
        """
        loop = self._start()
        with self._slots:
            job = self._render_fresh(url, visit, wait_for, timeout, max_bytes)
            try:
                future = asyncio.run_coroutine_threadsafe(job, loop)
            except RuntimeError as exc:  # the loop was closed under it (``close``)
                job.close()
                raise RenderFailed(f"the renderer is closed: {exc}") from exc
            return future.result()

    def close(self) -> None:
        """Close the browser and stop its thread (a no-op when none was started)."""
        with self._lock:
            thread, loop = self._thread, self._loop
            self._thread = self._loop = None
        if thread is None or loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=30)
        except Exception as exc:  # any: closing goes on whatever the browser did
            log.debug("browser not closed cleanly: %s", exc)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        if not thread.is_alive():
            loop.close()  # a render asked for after this one fails at once
        self._fetchers.shutdown(wait=False, cancel_futures=True)
        if self._refuser is not None:
            self._refuser.close()
            self._refuser = None

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._pid != os.getpid():  # forked: the thread and the browser stayed in the parent
                self._pid = os.getpid()
                self._reset()
            if self._thread is None or self._loop is None:
                # One-line errors in the caller's thread, before anything starts.
                if importlib.util.find_spec("playwright") is None:
                    raise BrowserNotFound("rendering needs Playwright: pip install -e '.[browser]'")
                find_browser(self.browser_path)
                loop = asyncio.new_event_loop()
                self._fetchers = concurrent.futures.ThreadPoolExecutor(
                    FETCHES_PER_PAGE * self.pages, thread_name_prefix="render-fetch"
                )
                self._thread = threading.Thread(target=loop.run_forever, name="renderer", daemon=True)
                self._thread.start()
                self._loop = loop
            return self._loop

    async def _shutdown(self) -> None:
        browser, playwright = self._browser, self._playwright
        self._browser = self._playwright = None
        self._sites.clear()
        if browser is not None and browser.is_connected():
            await browser.close()
        if playwright is not None:
            await playwright.stop()

    async def _render_fresh(
        self, url: str, visit: Visit, wait_for: str | None, timeout: float, max_bytes: int
    ) -> Response:
        """``_render`` in a connected browser (started if there is none, restarted if it died), killed
        if the render is not over ``RENDER_GRACE`` past its deadline (a FetchTimeout)."""
        from playwright.async_api import Error

        for attempt in (1, 2):
            browser = await self._connected_browser()
            deadline = time.monotonic() + timeout
            with KillTimer(browser, self._browser_pid, deadline + RENDER_GRACE) as watchdog:
                try:
                    site, tab = await self._tab(browser, visit)
                except Error as exc:  # the browser died between two pages: once more with a new one
                    self._forget(browser)
                    if watchdog.fired:
                        raise _overran(timeout) from exc
                    if attempt == 2:
                        raise RenderFailed(f"browser failed: {exc}") from exc
                    continue
                done = False
                try:
                    response = await _render(tab, url, visit, wait_for, deadline, timeout, max_bytes)
                    done = True
                    return response
                except (Error, RenderFailed) as exc:
                    if watchdog.fired:
                        raise _overran(timeout) from exc
                    if isinstance(exc, Error):  # the browser died as the DOM was taken
                        raise RenderFailed(f"render failed: {str(exc).splitlines()[0]}") from exc
                    raise
                finally:
                    await self._release(browser, site, tab, reuse=done and not watchdog.fired)
                    if watchdog.fired:
                        self._forget(browser)
        raise AssertionError("unreachable")

    async def _connected_browser(self) -> Any:
        if self._launching is None:
            self._launching = asyncio.Lock()
        async with self._launching:  # renders that find no browser start one between them
            if self._browser is None or not self._browser.is_connected():
                self._forget(self._browser)
                await self._launch()
            return self._browser

    def _forget(self, browser: Any) -> None:
        """Drop ``browser`` (dead, or killed) and its contexts: the next render starts another."""
        if browser is not None and browser is self._browser:
            self._browser = None
            self._sites.clear()

    async def _tab(self, browser: Any, visit: Visit) -> tuple[_Site | None, _Tab]:
        """A page for a render of ``visit``: an idle one of its site's context, else a new one in it
        (the context made if there is none); without a site, a page in a fresh context."""
        if visit.site is None:
            context = await self._new_context(browser, visit.user_agent)
            try:
                return None, await _new_tab(context, self._fetchers)
            except BaseException:
                await _close_quietly(context.close())
                raise
        key = (visit.site, visit.user_agent)
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:  # two first renders of a site open one context between them
            site = self._sites.get(key)
            if site is None:
                site = self._sites[key] = _Site(await self._new_context(browser, visit.user_agent))
            self._sites.move_to_end(key)
            site.busy += 1
        await self._close_idle_sites()
        try:
            tab = site.idle.pop() if site.idle else await _new_tab(site.context, self._fetchers)
        except BaseException:
            site.busy -= 1
            raise
        return site, tab

    async def _new_context(self, browser: Any, user_agent: str | None) -> Any:
        context = await browser.new_context(user_agent=user_agent, service_workers="block")
        # What no page of ours routes (a popup's requests, say) is aborted, never sent.
        await context.route("**/*", lambda route: route.abort("blockedbyclient"))
        return context

    async def _close_idle_sites(self) -> None:
        """Close the contexts of the sites least recently rendered, idle, beyond ``KEPT_SITES``."""
        for key in list(self._sites)[: max(0, len(self._sites) - KEPT_SITES)]:
            site = self._sites.get(key)
            if site is not None and site.busy == 0:
                del self._sites[key]
                await _close_quietly(site.context.close())

    async def _release(self, browser: Any, site: _Site | None, tab: _Tab, reuse: bool) -> None:
        """The render's page back to its site's idle ones (its document stopped and emptied, ``QUIETEN``,
        so that nothing of it runs on), or closed (with its context, for a render without a site)."""
        from playwright.async_api import Error

        job, tab.job = tab.job, None
        if job is not None and job.pending:  # a late request's record comes before the page's own
            await asyncio.wait(job.pending, timeout=max(0.0, job.deadline - time.monotonic()))
        if site is None:
            await _close_quietly(tab.page.context.close())
            return
        site.busy -= 1
        if reuse and browser is self._browser and len(site.idle) < self.pages and tab.renders < RENDERS_PER_PAGE:
            try:
                await asyncio.wait_for(tab.page.evaluate(QUIETEN), RENDER_GRACE)
                if tab.renders % COLLECT_EVERY == 0:
                    await asyncio.wait_for(tab.devtools.send("HeapProfiler.collectGarbage"), RENDER_GRACE)
                site.idle.append(tab)
                return
            except (Error, TimeoutError):
                pass
        await _close_quietly(tab.page.close())

    async def _launch(self) -> None:
        executable = find_browser(self.browser_path)
        if self._refuser is None:
            self._refuser = socket.socket()
            self._refuser.bind(("127.0.0.1", 0))  # never listened on: a connection to it is refused
        try:
            if self._playwright is None:
                from playwright.async_api import async_playwright

                self._playwright = await async_playwright().start()
            args = confinement(self._refuser.getsockname()[1]) + list(SPEED_SWITCHES)
            self._browser = await self._playwright.chromium.launch(executable_path=executable, headless=True, args=args)
            self._browser_pid = await browser_pid(self._browser)
        except Exception as exc:  # Playwright's Error: the browser (or Playwright's driver) did not start
            raise RenderFailed(f"browser {executable} did not start: {str(exc).splitlines()[0]}") from exc
        if self._browser_pid is None:
            log.warning("browser %s gave no process id: a render past its deadline cannot be cut", executable)
        self.launches += 1
        log.info("browser started: %s", executable)


async def _new_tab(context: Any, fetchers: concurrent.futures.Executor) -> _Tab:
    """A new page of ``context``, each of its requests routed for the render it serves (``_Tab.job``)."""
    page = await context.new_page()
    tab = _Tab(page)
    tab.devtools = await context.new_cdp_session(page)

    async def routed(request: Any) -> None:
        job = tab.job
        if job is None:  # between two renders: the last one's document is stopped, or stopping
            await answer(request.abort("blockedbyclient"))
            return
        await route(request, page, job, fetchers)

    await page.route("**/*", routed)
    await page.route_web_socket("**/*", lambda ws: None)  # never connected to a server
    return tab


async def _close_quietly(closing: Any) -> None:
    """Await ``closing`` (a page's or context's ``close()``); an error (the browser gone) is nothing to report."""
    from playwright.async_api import Error

    try:
        await closing
    except Error:
        pass


def _overran(timeout: float) -> FetchTimeout:
    return FetchTimeout(
        f"render timed out: still running {RENDER_GRACE:g}s past its limit of {timeout:g}s (browser killed)"
    )


async def _render(
    tab: _Tab, url: str, visit: Visit, wait_for: str | None, deadline: float, timeout: float, max_bytes: int
) -> Response:
    """Render ``url`` in ``tab`` by ``deadline`` (``time.monotonic()``; see ``Renderer.render``)."""
    from playwright.async_api import Error
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    started, clock = datetime.now(UTC), deadline - timeout
    navigation = Navigation()
    page = tab.page
    tab.job = Job(visit, deadline, navigation)
    tab.renders += 1
    loaded = False
    try:
        await page.goto(url, timeout=_ms_left(deadline), wait_until="load")
        loaded = True
        if wait_for:
            waiting = _evaluate(tab.devtools, WAIT_FOR_SELECTOR % json.dumps(wait_for), promise=True)
            await asyncio.wait_for(waiting, max(0.001, deadline - time.monotonic()))
        else:
            await page.wait_for_load_state("networkidle", timeout=_ms_left(deadline))
    except (PlaywrightTimeout, TimeoutError, Error) as exc:
        if navigation.unrendered is not None:
            return navigation.unrendered
        if navigation.error is not None:
            raise navigation.error
        if isinstance(exc, (PlaywrightTimeout, TimeoutError)):
            if not loaded or wait_for:  # loaded with no selector to wait for, the network never quiet: the DOM as is
                what = f"waiting for {wait_for!r}" if loaded else "loading"
                took = time.monotonic() - clock
                raise FetchTimeout(f"render timed out after {took:.1f}s {what} (limit {timeout:g}s)") from exc
        elif not page.is_closed() and page.context.browser and page.context.browser.is_connected():
            raise RenderFailed(f"render failed: {str(exc).splitlines()[0]}") from exc
        else:
            raise RenderFailed(f"browser died during the render: {str(exc).splitlines()[0]}") from exc
    html = str(await _evaluate(tab.devtools, DOCUMENT_HTML) or "").encode("utf-8")
    if len(html) > max_bytes:
        raise BodyTooLarge(f"rendered DOM over {max_bytes:,} bytes ({len(html):,})")
    document = navigation.response
    headers = dict(document.headers) if document else {}
    headers["content-type"] = "text/html; charset=utf-8"
    return Response(
        url=page.url,
        status=document.status if document else 200,
        headers=headers,
        body=html,
        started=started,
        elapsed=time.monotonic() - clock,
        encoding="utf-8",
    )


async def _evaluate(devtools: Any, expression: str, promise: bool = False) -> Any:
    """The value of ``expression`` in the page's own world (awaited if it is a ``promise``); RenderFailed
    if it throws."""
    # Not Playwright's selectors nor page.content(): they run its injected script, evaluated anew in
    # each document; nor a world of our own, a V8 context a document. What the page's scripts could
    # change here gives a page nothing it lacks (it writes its DOM); a wait it defeats ends at the deadline.
    reply = await devtools.send(
        "Runtime.evaluate",
        {
            "expression": expression,
            "awaitPromise": promise,
            "returnByValue": True,
        },
    )
    if "exceptionDetails" in reply:
        details = reply["exceptionDetails"]
        why = details.get("exception", {}).get("description") or details.get("text") or "a script error"
        raise RenderFailed(f"render failed: {why.splitlines()[0]}")
    return reply["result"].get("value")


def _ms_left(deadline: float) -> float:
    return max(1.0, (deadline - time.monotonic()) * 1000)


def rendering(spider: Any, meta: Mapping[str, Any]) -> tuple[bool, str | None]:
    """Whether a request is rendered, and the selector waited for: the request's ``render`` /
    ``render_wait`` (carried in its meta), else the spider's."""
    render = meta.get("render", getattr(spider, "render", False))
    wait = meta.get("render_wait", getattr(spider, "render_wait", None))
    return bool(render), (str(wait) if render and wait else None)
